#!/usr/bin/env python3
"""Two versions of ashd side by side: the speed table's per-session rows on each, and their ratio.

    .venv/bin/python scripts/bench_ab.py A_DIR B_DIR [--n 160] [--block 10]
    .venv/bin/python scripts/bench_ab.py A_DIR B_DIR --no-spare [--n 40] [--block 5]
    .venv/bin/python scripts/bench_ab.py A_DIR B_DIR --postgres postgresql://postgres@127.0.0.1:5432/test

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

`--no-spare` measures the rows where every create starts its sandbox (both servers keep no warm
sandbox): each block is `--block` single creates, a DELETE and 0.3 s after each, then `--block`
rounds of 4 creates at once, each DELETEd after its round. Beside each p50 it prints the whole
machine's CPU per create during those rounds (from /proc/stat, every process: the server, the fork
server, the sandboxes, the kernel's work for them, this client), which is what 4 creates at once on
two cores wait for.
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
import bench_sessions
from bench_sessions import (
    TABLE,
    Client,
    ServerCpu,
    ashd_server,
    concurrent_creates,
    fake_model,
    script_instant,
    table_round,
    timed,
)

NO_SPARE = ("create, no spare", "4 creates at once (each)")


def machine_cpu_seconds() -> float:
    """Busy time of every CPU since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK")


async def no_spare_block(c: Client, out: dict[str, list[float]], cpu: dict[str, list[float]], block: int) -> None:
    singles = []
    busy = 0.0
    for _ in range(block):
        before = machine_cpu_seconds()
        ms, body = await timed(lambda: c.call("POST", "/api/sessions", {"agent": "bench"}))
        singles.append(ms)
        await c.call("DELETE", f"/api/sessions/{body['session']['id']}")
        await asyncio.sleep(0.3)  # its teardown and snapshot, counted with it
        busy += machine_cpu_seconds() - before
    out[NO_SPARE[0]] += singles
    cpu[NO_SPARE[0]].append(busy * 1000 / block)
    before = machine_cpu_seconds()
    out[NO_SPARE[1]] += await concurrent_creates(c, "bench", block)
    await asyncio.sleep(0.3)
    cpu[NO_SPARE[1]].append((machine_cpu_seconds() - before) * 1000 / (4 * block))


async def no_spare(args: argparse.Namespace, paths: list[Path]) -> None:
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        async with ashd_server(model_url, 0, {"PYTHONPATH": str(paths[0])}) as (url_a, key_a, _pa), \
                ashd_server(model_url, 0, {"PYTHONPATH": str(paths[1])}) as (url_b, key_b, _pb):
            sides: list[tuple[Client, dict[str, list[float]], dict[str, list[float]]]] = [
                (Client(http, url, key), {row: [] for row in NO_SPARE}, {row: [] for row in NO_SPARE})
                for url, key in ((url_a, key_a), (url_b, key_b))]
            for client, _, _ in sides:
                await client.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
                await concurrent_creates(client, "bench", 1)  # the first sandboxes' one-time work
            for i in range(max(1, args.n // args.block)):
                for client, out, cpu in (sides if i % 2 == 0 else sides[::-1]):
                    await asyncio.sleep(1.0)
                    await no_spare_block(client, out, cpu, args.block)
    (_, a, cpu_a), (_, b, cpu_b) = sides
    print(f"A {paths[0]}\nB {paths[1]}")
    print(f"{'row (p50)':<40} {'A ms':>8} {'B ms':>8} {'B/A':>6} {'A cpu':>7} {'B cpu':>7}  (machine CPU, ms/create)")
    for row in NO_SPARE:
        x, y = statistics.median(a[row]), statistics.median(b[row])
        cx, cy = statistics.median(cpu_a[row]), statistics.median(cpu_b[row])
        print(f"{row:<40} {x:8.2f} {y:8.2f} {y / x:6.2f} {cx:7.2f} {cy:7.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("a", type=Path, help="checkout A")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--n", type=int, default=160, help="rounds on each")
    parser.add_argument("--block", type=int, default=10, help="rounds on one server before the other's")
    parser.add_argument("--no-spare", action="store_true", help="the rows where a create starts its sandbox")
    parser.add_argument("--postgres", metavar="URL",
                        help="both servers store in PostgreSQL, each in a fresh database on this server")
    args = parser.parse_args()
    bench_sessions.POSTGRES = args.postgres
    paths = [args.a.resolve(), args.b.resolve()]
    for path in paths:
        if not (path / "ashd" / "__init__.py").is_file():
            parser.error(f"{path} is not an ashd checkout")
    os.chdir("/")  # neither checkout may be the working directory (see the docstring)
    if args.no_spare:
        await no_spare(args, paths)
        return
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
