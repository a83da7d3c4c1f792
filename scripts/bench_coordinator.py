#!/usr/bin/env python3
"""What the coordinator hop costs (issue 11): a standalone `ashd serve` and a coordinator with two
`ashd runner`s, started in the same run on this machine against the bundled fake model, measured
interleaved operation by operation so both see the same load.

Prints p50/p99 of: create a session, GET a session, message → first `message` frame, and of a long
streamed turn (partial messages, instant model) the time per frame (wall time / frames: the
per-frame cost of the path) and the gap between consecutive frames as the client reads them (its
p99 shows stalls), for standalone and through the coordinator; then sessions created
per second with N creates in flight, standalone (one pool) and through the coordinator (two
runners). Both layouts use PostgreSQL (a fresh database each, dropped at the end), so the
difference is the hop, not the database.

    .venv/bin/python scripts/bench_coordinator.py [--n 30] [--frames 500] [--sessions 24]
    .venv/bin/python scripts/bench_coordinator.py --standalone URL KEY --coordinator URL KEY \
        --agent NAME --model FAKE_MODEL_URL

With `--standalone`/`--coordinator` it measures servers that are already running instead of
starting its own: the agent must be deployed on both, and both must use the fake model at
FAKE_MODEL_URL (`python -m ashd.devtools.fake_model`), where the script registers its turns.
PostgreSQL: ASHD_TEST_POSTGRES_URL, default
postgresql://postgres@127.0.0.1:5432/test (its user must be allowed to create databases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
from bench_sessions import (  # beside this file (scripts/ is the first sys.path entry)
    Client,
    fake_model,
    first_message_frame,
    free_port,
    pct,
    script_instant,
    timed,
    wait_http,
)

PY = sys.executable
PG_URL = os.environ.get("ASHD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SECRET = "bench-internal-secret-0123456789abcdef"
API_KEY = "bench-api-key-0123456789abcdefghijklmnop"


@contextlib.asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    admin_dsn = PG_URL.replace("postgresql+asyncpg://", "postgresql://")
    name = f"ashd_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield f"{admin_dsn.rpartition('/')[0]}/{name}"
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


class Processes:
    """Started `ashd` processes, each in its own directory; all stopped (SIGTERM, then kill) at the end."""

    def __init__(self, root: Path, model_url: str) -> None:
        self.root, self.model_url = root, model_url
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, command: str, **settings: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        env.update({"SERVICE_DATA_DIR": str(self.root / name), "SERVICE_HOST": "127.0.0.1",
                    "SERVICE_LOG_LEVEL": "warning", "SERVICE_RATE_LIMIT_RPS": "100000",
                    "SERVICE_RATE_LIMIT_BURST": "100000", "ANTHROPIC_BASE_URL": self.model_url,
                    "ANTHROPIC_API_KEY": "bench-key", **settings})
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115  (the process keeps it)
        self.procs.append(subprocess.Popen([PY, "-m", "ashd", command], env=env, stdout=log, stderr=log))

    def stop(self) -> None:
        for proc in reversed(self.procs):  # runners first: they deregister while a coordinator is up
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_runners(c: Client, want: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{c.url}/health") as resp:
                    if (await resp.json()).get("remoteRunners", 0) >= want:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{want} runners did not register with {c.url}")


@contextlib.asynccontextmanager
async def layouts(model_url: str, capacity: int, prewarm: int) -> AsyncIterator[tuple[str, str]]:
    """(standalone URL, coordinator URL), both on fresh PostgreSQL databases, both with API_KEY."""
    root = Path(tempfile.mkdtemp(prefix="ashd-benchc-", dir="/tmp"))
    procs = Processes(root, model_url)
    try:
        async with fresh_database() as standalone_db, fresh_database() as cluster_db:
            alone, coord = free_port(), free_port()
            procs.start("standalone", "serve", SERVICE_PORT=str(alone), SERVICE_DATABASE_URL=standalone_db,
                        SERVICE_API_KEY=API_KEY, SERVICE_MAX_SANDBOXES=str(2 * capacity),
                        SERVICE_PREWARM=str(2 * prewarm))
            procs.start("coordinator", "serve", SERVICE_MODE="coordinator", SERVICE_PORT=str(coord),
                        SERVICE_DATABASE_URL=cluster_db, SERVICE_API_KEY=API_KEY, SERVICE_INTERNAL_SECRET=SECRET)
            await wait_http(f"http://127.0.0.1:{alone}/health", 120)
            await wait_http(f"http://127.0.0.1:{coord}/health", 120)
            for name in ("runner-1", "runner-2"):
                procs.start(name, "runner", SERVICE_RUNNER_ID=name, SERVICE_SERVER_URL=f"http://127.0.0.1:{coord}",
                            SERVICE_RUNNER_PORT=str(free_port()), SERVICE_PORT=str(free_port()),
                            SERVICE_RUNNER_ADVERTISE_HOST="127.0.0.1", SERVICE_DATABASE_URL=cluster_db,
                            SERVICE_INTERNAL_SECRET=SECRET, SERVICE_MAX_SANDBOXES=str(capacity),
                            SERVICE_PREWARM=str(prewarm))
            url = f"http://127.0.0.1:{coord}"
            async with aiohttp.ClientSession() as http:
                await wait_runners(Client(http, url, API_KEY), 2)
            yield f"http://127.0.0.1:{alone}", url
    finally:
        procs.stop()
        shutil.rmtree(root, ignore_errors=True)


async def long_turn(c: Client, sid: str) -> tuple[float, list[float]]:
    """One long streamed turn: (ms per frame = wall time / frames, ms between consecutive frames
    as the client reads them; frames that arrive in one read show a 0 gap)."""
    gaps: list[float] = []
    frames = 0
    t0 = last = time.perf_counter()
    async with c.http.post(f"{c.url}/api/sessions/{sid}/messages", headers=c.headers,
                           json={"content": "bench-long", "includePartialMessages": True}) as resp:
        if resp.status >= 400:
            raise RuntimeError(f"message: {resp.status} {await resp.text()}")
        async for raw in resp.content:
            if raw.startswith(b"event:"):
                now = time.perf_counter()
                if frames:
                    gaps.append((now - last) * 1000)
                last = now
                frames += 1
    return (time.perf_counter() - t0) * 1000 / max(1, frames), gaps


async def sessions_per_second(c: Client, agent: str, total: int, in_flight: int) -> float:
    """Create `total` sessions with `in_flight` requests at a time; sessions per second. Deleted after."""
    ids: list[str] = []
    queue = list(range(total))

    async def worker() -> None:
        while queue:
            queue.pop()
            ids.append((await c.call("POST", "/api/sessions", {"agent": agent}))["session"]["id"])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    rate = total / (time.perf_counter() - t0)
    await asyncio.gather(*(c.call("DELETE", f"/api/sessions/{sid}") for sid in ids))
    return rate


ROWS = ("create session", "GET a session", "message -> first message frame", "long turn: ms per frame",
        "long turn: gap between frames")


def report(name: str, ours: list[float], theirs: list[float]) -> None:
    a, b = statistics.median(ours), statistics.median(theirs)
    ratio = f"{b / a:6.2f}x" if a > 0 else "     —"
    print(f"{name:<34} {a:8.2f} {pct(ours, 0.99):8.2f}   {b:8.2f} {pct(theirs, 0.99):8.2f}   {ratio}")


async def measure(args: argparse.Namespace, alone: Client, coord: Client, agent: str) -> None:
    results: dict[str, dict[str, list[float]]] = {"alone": {r: [] for r in ROWS}, "coord": {r: [] for r in ROWS}}
    sessions: dict[str, str] = {}
    for _ in range(args.n):  # interleaved: both layouts see the same machine load
        for key, c in (("alone", alone), ("coord", coord)):
            out = results[key]
            ms, body = await timed(lambda: c.call("POST", "/api/sessions", {"agent": agent}))  # noqa: B023
            out[ROWS[0]].append(ms)
            sid = body["session"]["id"]
            for _ in range(10):
                out[ROWS[1]].append((await timed(lambda: c.call("GET", f"/api/sessions/{sid}")))[0])  # noqa: B023
            out[ROWS[2]].append(await first_message_frame(c, sid, "bench-instant"))
            if key in sessions:
                await c.call("DELETE", f"/api/sessions/{sessions[key]}")
            sessions[key] = sid
    for _ in range(args.turns):
        for key, c in (("alone", alone), ("coord", coord)):
            per_frame, gaps = await long_turn(c, sessions[key])
            results[key][ROWS[3]].append(per_frame)
            results[key][ROWS[4]].extend(gaps)
    for key, c in (("alone", alone), ("coord", coord)):
        await c.call("DELETE", f"/api/sessions/{sessions[key]}")
    print(f"{'':<34} {'standalone (ms)':>17}   {'coordinator (ms)':>17}   {'p50':>6}")
    print(f"{'operation':<34} {'p50':>8} {'p99':>8}   {'p50':>8} {'p99':>8}   {'ratio':>6}")
    for row in ROWS:
        report(row, results["alone"][row], results["coord"][row])
    rate_alone = await sessions_per_second(alone, agent, args.sessions, args.in_flight)
    rate_coord = await sessions_per_second(coord, agent, args.sessions, args.in_flight)
    print(f"sessions created per second, {args.in_flight} in flight, {args.sessions} sessions: "
          f"standalone (one pool) {rate_alone:.2f}/s, coordinator over two runners {rate_coord:.2f}/s")


async def script_model(http: aiohttp.ClientSession, model_url: str, frames: int) -> None:
    await script_instant(http, model_url)
    await http.post(model_url + "/_fake/scripts", json={
        "match": "bench-long", "turns": [{"content": [{"type": "text", "text": "x" * (8 * frames)}], "chunk": 8}]})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30, help="rounds of create / 10 GETs / first frame")
    parser.add_argument("--frames", type=int, default=500, help="text deltas per long streamed turn")
    parser.add_argument("--turns", type=int, default=10, help="long streamed turns per layout")
    parser.add_argument("--sessions", type=int, default=24, help="sessions for the sessions-per-second row")
    parser.add_argument("--in-flight", type=int, default=8, help="creates in flight at once")
    parser.add_argument("--capacity", type=int, default=16, help="SERVICE_MAX_SANDBOXES of each runner")
    parser.add_argument("--prewarm", type=int, default=2, help="SERVICE_PREWARM of each runner")
    parser.add_argument("--standalone", nargs=2, metavar=("URL", "KEY"))
    parser.add_argument("--coordinator", nargs=2, metavar=("URL", "KEY"))
    parser.add_argument("--agent", default="bench")
    parser.add_argument("--model", help="with --standalone/--coordinator: the fake model both servers use")
    args = parser.parse_args()
    if args.standalone and args.coordinator:
        if not args.model:
            parser.error("--standalone and --coordinator need --model: the fake model both servers use")
        async with aiohttp.ClientSession() as http:
            await script_model(http, args.model, args.frames)
            alone = Client(http, args.standalone[0].rstrip("/"), args.standalone[1])
            coord = Client(http, args.coordinator[0].rstrip("/"), args.coordinator[1])
            await measure(args, alone, coord, args.agent)
        return
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_model(http, model_url, args.frames)
        async with layouts(model_url, args.capacity, args.prewarm) as (alone_url, coord_url):
            alone, coord = Client(http, alone_url, API_KEY), Client(http, coord_url, API_KEY)
            for c in (alone, coord):
                await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            await measure(args, alone, coord, "bench")


if __name__ == "__main__":
    asyncio.run(main())
