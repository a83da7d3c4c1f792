#!/usr/bin/env python3
"""What the reads that clients, operator tools and monitors make cost: latency and server CPU.

    .venv/bin/python scripts/bench_reads.py [--n 200] [--turns 5] [--gap-ms 3]

Starts the fake model and an ashd server as separate processes (SQLite, as the README's first
command does), deploys an agent, runs `--turns` turns in one session, then calls each read `--n`
times, `--gap-ms` apart, from this process over HTTP, and prints for each: p50 and p99 latency and
the server's CPU time (every thread) from the request to `--gap-ms` after its answer, p50. These
are the calls an SDK makes after a turn (messages, events, logs, files), an operator's CLI (lists,
storage, usage) and a monitor (/health, /metrics); none is a row of `bench_sessions.py`'s table.
Last, a session's GET right after each of `--n`/4 more turns (what the turn changed is read).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import Client, ServerCpu, ashd_server, fake_model, first_message_frame, pct, script_instant


def reads(sid: str) -> list[tuple[str, str]]:
    return [
        ("GET /health", "/health"),
        ("GET /metrics", "/metrics"),
        ("GET /api/sessions", "/api/sessions"),
        ("GET /api/sessions/{id}", f"/api/sessions/{sid}"),
        ("GET .../messages", f"/api/sessions/{sid}/messages"),
        ("GET .../events", f"/api/sessions/{sid}/events"),
        ("GET .../logs", f"/api/sessions/{sid}/logs"),
        ("GET .../files", f"/api/sessions/{sid}/files"),
        ("GET /api/agents", "/api/agents"),
        ("GET /api/agents/{name}", "/api/agents/bench"),
        ("GET /api/storage", "/api/storage"),
        ("GET /api/usage", "/api/usage"),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5, help="turns in the session read")
    parser.add_argument("--gap-ms", type=float, default=3.0, help="pause after each read")
    args = parser.parse_args()
    gap = args.gap_ms / 1000
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        async with ashd_server(model_url, prewarm=2) as (url, key, proc):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            sid = (await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]
            for _ in range(args.turns):
                await first_message_frame(c, sid, "bench-instant")
            cpu = ServerCpu(proc.pid)
            for name, path in reads(sid):
                latency, spent = [], []
                for _ in range(args.n):
                    before, t0 = cpu.seconds(), time.perf_counter()
                    async with http.get(url + path, headers=c.headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"{path}: {resp.status}")
                    latency.append((time.perf_counter() - t0) * 1000)
                    await asyncio.sleep(gap)
                    spent.append((cpu.seconds() - before) * 1000)
                report(name, latency, spent)
            # What an SDK often does once a turn is over: read the session (its counts, lastActiveAt).
            latency, spent = [], []
            for _ in range(max(1, args.n // 4)):
                await first_message_frame(c, sid, "bench-instant")  # read to the turn's end
                before, t0 = cpu.seconds(), time.perf_counter()
                await c.call("GET", f"/api/sessions/{sid}")
                latency.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(gap)
                spent.append((cpu.seconds() - before) * 1000)
            report("GET .../{id} after a turn", latency, spent)


def report(name: str, latency: list[float], spent: list[float]) -> None:
    print(f"{name:26s} p50 {statistics.median(latency):6.2f} ms   p99 {pct(latency, 0.99):6.2f} ms   "
          f"server CPU p50 {statistics.median(spent):5.2f} ms   (n={len(latency)})")


if __name__ == "__main__":
    asyncio.run(main())
