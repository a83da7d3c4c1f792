#!/usr/bin/env python3
"""Two versions of ashd side by side: the speed table's per-session rows on each, and their ratio.

    .venv/bin/python scripts/bench_ab.py A_DIR B_DIR [--n 160] [--block 10]

A_DIR and B_DIR are checkouts (a `git worktree add /tmp/a <commit>` each): each server imports
ashd from its own (PYTHONPATH, from a working directory outside both), with this venv's
dependencies. Both servers run for the whole measurement, with the bundled fake model; the rounds
of `bench_sessions.table_round` (create, GETs, first `message` frame, pause, warm resume, DELETE)
run in blocks of `--block` on one server at a time, A and B alternating which goes first, with a
second's pause before each block. Prints each row's p50 on A and on B, B/A, and the server CPU
(every thread) p50 during each.

Why blocks rather than operation by operation: an operation's background work (a replacement
spare's start, an owed snapshot: tens of ms of CPU on two cores) starts in the first quiet moment,
which on an interleaved pair is the other server's round, so each server's background work landed
on the other's figures and the ratio measured when it started, not what it cost. Why the working
directory: `-m ashd` puts it first on sys.path, so from a checkout both servers ran that checkout
(docs/performance.md, nineteenth pass, for both). Run it twice with A and B swapped: on these
machines a ratio within 0.9-1.1 is within what one run varies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import TABLE, Client, ServerCpu, ashd_server, fake_model, script_instant, table_round


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("a", type=Path, help="checkout A")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--n", type=int, default=160, help="rounds on each")
    parser.add_argument("--block", type=int, default=10, help="rounds on one server before the other's")
    args = parser.parse_args()
    paths = [args.a.resolve(), args.b.resolve()]
    for path in paths:
        if not (path / "ashd" / "__init__.py").is_file():
            parser.error(f"{path} is not an ashd checkout")
    os.chdir("/")  # neither checkout may be the working directory (see the docstring)
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        async with ashd_server(model_url, 2, {"PYTHONPATH": str(paths[0])}) as (url_a, key_a, proc_a), \
                ashd_server(model_url, 2, {"PYTHONPATH": str(paths[1])}) as (url_b, key_b, proc_b):
            sides: list[tuple[Client, dict[str, list[float]], ServerCpu]] = [
                (Client(http, url, key), {row: [] for row in TABLE}, ServerCpu(proc.pid))
                for url, key, proc in ((url_a, key_a, proc_a), (url_b, key_b, proc_b))]
            for side in sides:
                await side[0].call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            for i in range(max(1, args.n // args.block)):
                for client, out, cpu in (sides if i % 2 == 0 else sides[::-1]):
                    await asyncio.sleep(1.0)  # the other server's background work is over
                    for _ in range(args.block):
                        await table_round(client, "bench", out, gets=5, cpu=cpu)
    (_, a, cpu_a), (_, b, cpu_b) = sides
    print(f"A {paths[0]}\nB {paths[1]}")
    print(f"{'row (p50)':<40} {'A ms':>8} {'B ms':>8} {'B/A':>6} {'A cpu':>7} {'B cpu':>7}")
    for row in TABLE:
        x, y = statistics.median(a[row]), statistics.median(b[row])
        cx, cy = statistics.median(cpu_a.per_row[row]), statistics.median(cpu_b.per_row[row])
        print(f"{row:<40} {x:8.3f} {y:8.3f} {y / x:6.2f} {cx:7.3f} {cy:7.3f}")


if __name__ == "__main__":
    asyncio.run(main())
