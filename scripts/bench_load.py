#!/usr/bin/env python3
"""Many clients at once: throughput and latency of the session operations when they queue.

    .venv/bin/python scripts/bench_load.py [--clients 1,8,32] [--seconds 8] [--postgres URL]

The table's rows are measured one request at a time. Here `--clients` clients, each with its own
connection and its own session (as separate SDK users are), call for `--seconds` each, with no
pause between calls:

- **lifecycle**: a GET, a pause and a warm resume of the client's session, over and over;
- **turns**: a message to its `done` (the instant fake model) and a GET, over and over;
- **churn**: a create (pre-warmed pool), a message, a DELETE, over and over.

For each mix and each number of clients it prints operations per second, each operation's p50 and
p99, the server's CPU per operation (every thread), and how busy the machine's CPUs were. One
client's figures are the table's; where throughput stops growing with clients while the CPUs are
not busy, something serialises the work (docs/performance.md, thirty-seventh pass).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sessions as bs
from bench_ab import machine_cpu_seconds
from bench_sessions import Client, ServerCpu, ashd_server, fake_model, first_message_frame, script_instant, wait_warm

Step = Callable[[Client, str], Awaitable[str]]  # one operation on a client's session; the session to use next


async def _get(c: Client, sid: str) -> str:
    await c.call("GET", f"/api/sessions/{sid}")
    return sid


async def _pause(c: Client, sid: str) -> str:
    await c.call("POST", f"/api/sessions/{sid}/pause")
    return sid


async def _resume(c: Client, sid: str) -> str:
    await c.call("POST", f"/api/sessions/{sid}/resume")
    return sid


async def _message(c: Client, sid: str) -> str:
    await first_message_frame(c, sid, "bench-instant")  # reads the stream to its end
    return sid


async def _create(c: Client, _sid: str) -> str:
    return str((await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"])


async def _delete(c: Client, sid: str) -> str:
    await c.call("DELETE", f"/api/sessions/{sid}")
    return sid


MIXES: dict[str, list[tuple[str, Step]]] = {
    "lifecycle": [("GET", _get), ("pause", _pause), ("warm resume", _resume)],
    "turns": [("message to done", _message), ("GET", _get)],
    "churn": [("create", _create), ("message to done", _message), ("DELETE", _delete)],
}


async def _client_loop(c: Client, sid: str, steps: list[tuple[str, Step]], until: float,
                       out: dict[str, list[float]]) -> str:
    while time.monotonic() < until:
        for name, step in steps:
            t0 = time.perf_counter()
            sid = await step(c, sid)
            out[name].append((time.perf_counter() - t0) * 1000)
    return sid


async def run_mix(url: str, key: str, cpu: ServerCpu, mix: str, clients: int, seconds: float) -> None:
    steps = MIXES[mix]
    https = [aiohttp.ClientSession() for _ in range(clients)]
    try:
        cs = [Client(h, url, key) for h in https]
        sids = [""] * clients
        if mix != "churn":  # each client's own session, created before the clock starts
            for i, c in enumerate(cs):
                await wait_warm(c, 1)
                sids[i] = await _create(c, "")
        await wait_warm(cs[0], min(clients, 8))
        out: dict[str, list[float]] = {name: [] for name, _ in steps}
        cpu0, machine0, t0 = cpu.seconds(), machine_cpu_seconds(), time.perf_counter()
        until = time.monotonic() + seconds
        loops = (_client_loop(c, s, steps, until, out) for c, s in zip(cs, sids, strict=True))
        sids = list(await asyncio.gather(*loops))
        wall, spent = time.perf_counter() - t0, cpu.seconds() - cpu0
        busy = machine_cpu_seconds() - machine0
        ops = sum(len(v) for v in out.values())
        print(f"{mix:<10} {clients:>3} clients  {ops / wall:8,.0f} ops/s   server CPU {spent / ops * 1000:6.2f} ms/op"
              f" ({spent / wall:4.0%} of a CPU; the machine's CPUs {busy / wall / (os.cpu_count() or 1):4.0%} busy)")
        for name, values in out.items():
            print(f"    {name:<18} p50 {statistics.median(values):8.2f} ms   p99 {bs.pct(values, 0.99):8.2f} ms"
                  f"   (n={len(values)})")
        for c, sid in zip(cs, sids, strict=True):
            if sid and mix != "churn":
                await _delete(c, sid)
    finally:
        for h in https:
            await h.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="1,8,32", help="numbers of clients, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--mixes", default=",".join(MIXES), help="of: " + ", ".join(MIXES))
    parser.add_argument("--postgres", metavar="URL", help="store in PostgreSQL (a fresh database)")
    args = parser.parse_args()
    bs.POSTGRES = args.postgres
    counts = [int(n) for n in args.clients.split(",")]
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        async with ashd_server(model_url, prewarm=8, extra_env={"SERVICE_MAX_SANDBOXES": str(max(counts) + 16)}) \
                as (url, key, proc):
            await Client(http, url, key).call("POST", "/api/agents",
                                              {"name": "bench", "systemPrompt": "You benchmark."})
            cpu = ServerCpu(proc.pid)
            for mix in args.mixes.split(","):
                for clients in counts:
                    await run_mix(url, key, cpu, mix, clients, args.seconds)


if __name__ == "__main__":
    asyncio.run(main())
