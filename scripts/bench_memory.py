#!/usr/bin/env python3
"""Memory held per session: N sessions on a real ashd process, each after one turn (issue 13).

    .venv/bin/python scripts/bench_memory.py [--n 200] [--concurrency 4]

Creates N sessions through the HTTP API (the bundled fake model answers at once), runs one turn in
each, and keeps them all active. Then prints, over the sandboxes' process trees (the zygote's
children: each sandbox's pid 1 and everything under it): PSS per sandbox (its fair share of the
pages it shares with the zygote and the other sandboxes; p50/max), the zygote's own PSS, the server
process's RSS, the host's used memory before and after, and what that makes per session and how
many such sessions 24 GiB holds. `--n 1000` holds a thousand at once; creating stops early (and
says so) when the host's available memory falls below `--floor-mb`. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from bench_sessions import Client, ashd_server, fake_model, first_message_frame, script_instant

MIB = 1024 * 1024


def tree_pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_full_info().pss
    return total


def zygote_of(server: psutil.Process) -> psutil.Process | None:
    for child in server.children():
        try:
            if "ashd.zygote._fork_server" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--floor-mb", type=int, default=1536, help="stop creating below this much available memory")
    args = parser.parse_args()
    used_before = psutil.virtual_memory().used
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        extra = {"SERVICE_MAX_SANDBOXES": str(args.n + 8), "SERVICE_IDLE_TIMEOUT_SECONDS": "86400",
                 "SERVICE_PREWARM": "2"}
        async with ashd_server(model_url, prewarm=2, extra_env=extra) as (url, key, server):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            t0 = time.perf_counter()
            slots = asyncio.Semaphore(args.concurrency)
            done = 0
            floor = args.floor_mb * MIB

            async def one() -> None:
                nonlocal done
                async with slots:
                    if psutil.virtual_memory().available < floor:
                        return
                    body = await c.call("POST", "/api/sessions", {"agent": "bench"})
                    await first_message_frame(c, body["session"]["id"], "bench-instant")
                    done += 1
                    if done % 100 == 0:
                        print(f"  {done} sessions, {time.perf_counter() - t0:.0f} s", flush=True)

            await asyncio.gather(*(one() for _ in range(args.n)))
            elapsed = time.perf_counter() - t0
            if done < args.n:
                print(f"stopped at {done} sessions: the host's available memory fell below {args.floor_mb} MiB")
            await asyncio.sleep(2)  # let the turns' storage and the pool's refill settle
            zygote = zygote_of(server)
            if zygote is None:
                print("no zygote found under the server: cannot attribute sandbox memory")
                return
            sandboxes = zygote.children()
            pss = sorted(tree_pss(s) for s in sandboxes)
            zygote_pss = zygote.memory_full_info().pss
            server_rss = server.memory_info().rss
            used_after = psutil.virtual_memory().used
            per_session = (used_after - used_before) / max(done, 1)
            print(f"sessions created and run one turn each, held at once: {done} in {elapsed:.1f} s "
                  f"({done / elapsed:.1f}/s, {args.concurrency} at a time)")
            print(f"sandbox process trees under the zygote: {len(sandboxes)} (the sessions' and the warm spares)")
            print(f"PSS per sandbox after a turn: p50 {statistics.median(pss) / MIB:.1f} MiB, "
                  f"max {pss[-1] / MIB:.1f} MiB, total {sum(pss) / MIB:.0f} MiB")
            print(f"zygote PSS {zygote_pss / MIB:.1f} MiB; server RSS {server_rss / MIB:.1f} MiB")
            print(f"host memory used: +{(used_after - used_before) / MIB:.0f} MiB for {done} sessions "
                  f"= {per_session / MIB:.1f} MiB per session (page cache excluded)")
            print(f"sessions such sandboxes would fit in 24 GiB: {int(24 * 1024 * MIB / max(per_session, 1)):,}")


if __name__ == "__main__":
    asyncio.run(main())
