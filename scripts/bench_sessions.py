#!/usr/bin/env python3
"""Session benchmarks against a real ashd process and the bundled fake model.

Prints p50/p99 of each row of the speed table (issue 13): create (pre-warmed sandbox), DELETE, GET,
pause, warm resume, POST a message -> first `message` frame (instant model; and the same less the
model's own first byte as ashd's model proxy measured it), and the server's CPU time (every thread)
during each; then cold resume, the first frame late in one long conversation (its 20 turns to
`--turns`, each prompt ~450 characters, and the server's CPU per turn), 4 creates at once with no
warm sandbox, create without a warm sandbox, the server CPU time per streamed frame, frames per second through one
server with N concurrent sessions, and the memory held by a stalled stream; with `--mcp N`, N creates
of an agent with one stdio MCP server (a small Python one) and the first frame of a message sent
right after each. Everything runs on loopback, the server as a separate process, and stops by itself.

    .venv/bin/python scripts/bench_sessions.py [--n 30] [--concurrency 8] [--stalled 32] [--mcp 10]
    .venv/bin/python scripts/bench_sessions.py --compare URL KEY --compare-agent NAME [--compare-cold-agent NAME]
        [--compare-pid PID] [--own-mounts] [--n 30]
    .venv/bin/python scripts/bench_sessions.py --postgres postgresql://postgres@127.0.0.1:5432/test

`--compare` runs the table's rows against another server of this interface in the same run,
interleaved operation by operation with ashd (so both see the same machine load), and prints both
p50s (p99s) and the ratio of the p50s, then cold resume the same way; with `--compare-cold-agent`,
the rows with no warm sandbox too; with `--compare-pid`, both servers' CPU time per operation.
NAME is an agent already deployed there; docs/performance.md (thirty-second pass) says how the
reference implementation was run beside ashd.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(name: str, values_ms: list[float], extra: str = "") -> None:
    print(f"{name:<42} p50 {statistics.median(values_ms):8.2f} ms   p99 {pct(values_ms, 0.99):8.2f} ms"
          f"   (n={len(values_ms)}){extra}")


async def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as resp:
                    if resp.status < 500:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextlib.asynccontextmanager
async def fake_model() -> AsyncIterator[str]:
    port = free_port()
    # One request kept, not the CLI's 1,000: each holds its whole conversation, and a long one's
    # thousand copies made the fake's collector pause for 20-280 ms every 50-100 calls, in the
    # model's first byte (docs/performance.md, thirty-seventh pass). No benchmark reads them.
    proc = subprocess.Popen([PY, "-m", "ashd.devtools.fake_model", "--port", str(port), "--keep-requests", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_http(url + "/_fake/scripts")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


# `--postgres URL`: each server of the run gets a database of its own on that PostgreSQL server,
# made here and dropped after it (a database that held another server's rows has its API keys).
POSTGRES: str | None = None
OWN_MOUNTS = False


@contextlib.asynccontextmanager
async def fresh_database(admin_url: str) -> AsyncIterator[str]:
    import asyncpg

    name = f"ashd_bench_{os.getpid()}_{time.monotonic_ns()}"
    base = admin_url.replace("postgresql+asyncpg://", "postgresql://").rsplit("/", 1)[0]
    admin = await asyncpg.connect(admin_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{base}/{name}"
    finally:
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@contextlib.asynccontextmanager
async def ashd_server(model_url: str, prewarm: int, extra_env: dict[str, str] | None = None,
                      data: Path | None = None) -> AsyncIterator[tuple[str, str, psutil.Process]]:
    """An ashd process on a fresh data directory, removed after it; or on `data`, kept (a server
    started again on what an earlier one stored)."""
    async with contextlib.AsyncExitStack() as stack:
        if POSTGRES and "SERVICE_DATABASE_URL" not in (extra_env or {}):
            extra_env = {**(extra_env or {}), "SERVICE_DATABASE_URL": await stack.enter_async_context(
                fresh_database(POSTGRES))}
        async with _ashd_server(model_url, prewarm, extra_env, data) as server:
            yield server


@contextlib.asynccontextmanager
async def _ashd_server(model_url: str, prewarm: int, extra_env: dict[str, str] | None,
                       kept: Path | None) -> AsyncIterator[tuple[str, str, psutil.Process]]:
    data = kept or Path(tempfile.mkdtemp(prefix="ashd-bench-", dir="/tmp"))
    port = free_port()
    env = {**os.environ, "SERVICE_DATA_DIR": str(data / "d"), "SERVICE_PORT": str(port),
           "SERVICE_HOST": "127.0.0.1", "SERVICE_PREWARM": str(prewarm), "SERVICE_RATE_LIMIT_RPS": "100000",
           "SERVICE_RATE_LIMIT_BURST": "100000", "SERVICE_LOG_LEVEL": "warning", "SERVICE_MAX_SANDBOXES": "64",
           "ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "bench-key",
           "SERVICE_MODEL_RATE_PER_MINUTE": "1000000", "SERVICE_MODEL_RATE_BURST": "100000", **(extra_env or {})}
    # `-m` puts the working directory first on sys.path: run from the data dir, so that the ashd
    # served is the installed one (this checkout's, in its editable venv) or what PYTHONPATH names
    # (`bench_ab.py`), never a checkout that happens to be the caller's working directory.
    # `--own-mounts`: ashd's sandboxes' mounts stay in a mount namespace of their own. The reference's
    # bwrap binds the whole host tree (`--ro-bind / /`), and fails its start when one of ashd's disks
    # is unmounted while it copies the tree. Not the default: the namespace keeps a copy of every
    # mount the host had when it began (another process's sandbox disk, say) until ashd exits, so
    # their loop devices stay attached after the host unmounts them. `unshare` execs: the pid is ashd's.
    own_mounts = ["unshare", "--mount", "--propagation", "private"] if OWN_MOUNTS else []
    proc = subprocess.Popen([*own_mounts, PY, "-m", "ashd", "serve"], env=env, cwd=data, stdout=subprocess.DEVNULL,
                            stderr=open(data / "server.log", "wb"))  # noqa: SIM115
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_http(url + "/health")
        key = (data / "d" / "initial-api-key").read_text().strip()
        yield url, key, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if kept is None:
            shutil.rmtree(data, ignore_errors=True)


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        self.http, self.url, self.headers = http, url, {"Authorization": f"Bearer {key}"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        # No body, no Content-Type, as the published SDKs send a pause: aiohttp would add
        # application/octet-stream, which another server of this interface (Fastify's) answers 415.
        skip = () if body is not None else ("Content-Type",)
        async with self.http.request(method, self.url + path, json=body, headers=self.headers,
                                     skip_auto_headers=skip) as resp:
            data = await resp.json()
            if resp.status >= 400:
                raise RuntimeError(f"{method} {path}: {resp.status} {data}")
            return data

    async def stream(self, sid: str, content: str, partial: bool = False) -> int:
        frames = 0
        async with self.http.post(f"{self.url}/api/sessions/{sid}/messages", headers=self.headers,
                                  json={"content": content, "includePartialMessages": partial}) as resp:
            async for raw in resp.content:
                if raw.startswith(b"event:"):
                    frames += 1
        return frames


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = await fn()
    return (time.perf_counter() - t0) * 1000, result


async def wait_warm(c: Client, want: int, timeout: float = 30) -> bool:
    """True once the server's pool has `want` warm sandboxes; False when `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await c.call("GET", "/health"))["pool"]["warm"] >= want:
            return True
        await asyncio.sleep(0.02)
    return False


async def first_message_frame(c: Client, sid: str, content: str) -> float:
    """ms from sending a message to the first `message` frame's data (the rest is read and dropped)."""
    t0 = time.perf_counter()
    first: float | None = None
    async with c.http.post(f"{c.url}/api/sessions/{sid}/messages", headers=c.headers,
                           json={"content": content}) as resp:
        if resp.status >= 400:
            raise RuntimeError(f"message: {resp.status} {await resp.text()}")
        event = b""
        async for raw in resp.content:
            if first is None:
                if raw.startswith(b"event:"):
                    event = raw[6:].strip()
                elif raw.startswith(b"data:") and event == b"message":
                    first = (time.perf_counter() - t0) * 1000
    return first if first is not None else (time.perf_counter() - t0) * 1000


async def warm_if_known(c: Client) -> None:
    """Wait for a warm sandbox where the server says how many it has (ashd's /health)."""
    with contextlib.suppress(RuntimeError, KeyError, TypeError, aiohttp.ClientError):
        await wait_warm(c, 1)


TABLE = ("create session (pre-warmed sandbox)", "DELETE a session", "GET a session", "pause", "warm resume",
         "message -> first message frame")


class ServerCpu:
    """CPU time the server process spent (every thread) during each operation of a round, read from
    its process CPU clock (`clock_getcpuclockid`'s: the kernel brings a running thread's time up to
    date on each read, where `/proc` and psutil count what it had at its last switch or tick)."""

    def __init__(self, pid: int) -> None:
        self.clock = ((~pid) << 3) | 2  # the kernel's CPUCLOCK_SCHED clock of process `pid`
        self.per_row: dict[str, list[float]] = {row: [] for row in TABLE}

    def seconds(self) -> float:
        return time.clock_gettime(self.clock)

    @contextlib.contextmanager
    def during(self, row: str) -> Iterator[None]:
        start = self.seconds()
        yield
        self.per_row[row].append((self.seconds() - start) * 1000)


# Each first frame less its model call's first byte as ashd's model proxy measured it (`firstByteMs`
# in the session's model calls): what is left is ashd's own part of the row with an instant model.
# The proxy's clock starts when the call reaches it, so its own reading of the request and its send
# upstream (about 0.1-0.2 ms) are taken off too: the figure is a little under ashd's real part.
LESS_MODEL = "  the same, less the model's first byte"


async def model_first_byte(c: Client, sid: str) -> float | None:
    """The session's last model call's first byte (ms) as the model proxy measured it; None from a
    server without ashd's model-call records."""
    try:
        calls = (await c.call("GET", f"/api/sessions/{sid}/model-calls")).get("modelCalls") or []
    except (RuntimeError, aiohttp.ClientError, ValueError):
        return None
    value = calls[-1].get("firstByteMs") if calls else None
    return float(value) if isinstance(value, int | float) else None


async def table_round(c: Client, agent: str, out: dict[str, list[float]], gets: int,
                      cpu: ServerCpu | None = None, less_model: list[float] | None = None) -> None:
    """One pass over the table's per-session rows on one server; with `cpu`, the server's CPU time
    during each operation too (a message's: the whole turn, to its `done`); with `less_model`, each
    first frame less its model call's first byte (`LESS_MODEL`), read after the round's DELETE."""
    def during(row: str) -> contextlib.AbstractContextManager[None]:
        return cpu.during(row) if cpu is not None else contextlib.nullcontext()

    await warm_if_known(c)
    with during(TABLE[0]):
        ms, body = await timed(lambda: c.call("POST", "/api/sessions", {"agent": agent}))
    out[TABLE[0]].append(ms)
    sid = body["session"]["id"]
    for _ in range(gets):
        with during(TABLE[2]):
            out[TABLE[2]].append((await timed(lambda: c.call("GET", f"/api/sessions/{sid}")))[0])
    with during(TABLE[5]):
        out[TABLE[5]].append(await first_message_frame(c, sid, "bench-instant"))
    for row, method, path in ((TABLE[3], "POST", "/pause"), (TABLE[4], "POST", "/resume"), (TABLE[1], "DELETE", "")):
        with during(row):
            out[row].append((await timed(functools.partial(c.call, method, f"/api/sessions/{sid}{path}")))[0])
    if less_model is not None and (first_byte := await model_first_byte(c, sid)) is not None:
        less_model.append(out[TABLE[5]][-1] - first_byte)


async def concurrent_creates(c: Client, agent: str, rounds: int, at_once: int = 4) -> list[float]:
    """`at_once` creates sent together on a server with no warm sandbox; each request's own time."""
    times: list[float] = []
    for _ in range(rounds):
        results = await asyncio.gather(*(timed(lambda: c.call("POST", "/api/sessions", {"agent": agent}))
                                         for _ in range(at_once)))
        times.extend(ms for ms, _ in results)
        for _, body in results:
            await c.call("DELETE", f"/api/sessions/{body['session']['id']}")
    return times


async def compare(args: argparse.Namespace) -> None:
    other_url, other_key = args.compare
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        async with ashd_server(model_url, prewarm=2) as (url, key, proc):
            mine, theirs = Client(http, url, key), Client(http, other_url.rstrip("/"), other_key)
            await mine.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            ours: dict[str, list[float]] = {row: [] for row in TABLE}
            other: dict[str, list[float]] = {row: [] for row in TABLE}
            our_cpu = ServerCpu(proc.pid)
            their_cpu = ServerCpu(args.compare_pid) if args.compare_pid else None
            less_model: list[float] = []
            for _ in range(args.n):  # interleaved: both servers see the same load
                for client, agent, out, cpu in ((mine, "bench", ours, our_cpu),
                                                (theirs, args.compare_agent, other, their_cpu)):
                    # Each round starts once both have replaced the sandbox their last create
                    # claimed, so neither's start runs under the other's operations.
                    await settle(mine, theirs)
                    await table_round(client, agent, out, gets=10, cpu=cpu,
                                      less_model=less_model if client is mine else None)
            print(f"{'operation':<38} {'ashd p50 (p99)':>18} {'other p50 (p99)':>18} {'other/ashd':>10}")
            for row in TABLE:
                ratio_line(row, ours[row], other[row])
            if less_model:  # against the other's whole first frame: the reference's mock calls no model
                ratio_line(LESS_MODEL, less_model, other[TABLE[5]])
            print("server CPU during each (every thread), p50, ashd · other: " + " · ".join(
                f"{row.split(' (')[0]} {statistics.median(our_cpu.per_row[row]):.2f}"
                + (f" · {statistics.median(their_cpu.per_row[row]):.2f}" if their_cpu else "")
                for row in TABLE) + " ms")
            cold: tuple[list[float], list[float]] = ([], [])
            for _ in range(max(5, args.n // 3)):
                for client, agent, times in ((mine, "bench", cold[0]), (theirs, args.compare_agent, cold[1])):
                    await settle(mine, theirs)
                    sid = (await client.call("POST", "/api/sessions", {"agent": agent}))["session"]["id"]
                    await client.call("POST", f"/api/sessions/{sid}/stop")
                    resume = functools.partial(client.call, "POST", f"/api/sessions/{sid}/resume")
                    times.append((await timed(resume))[0])
                    await client.call("DELETE", f"/api/sessions/{sid}")
            ratio_line("cold resume (after stop)", *cold)
        if args.compare_cold_agent:
            async with ashd_server(model_url, prewarm=0) as (url, key, _proc):
                mine = Client(http, url, key)
                await mine.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
                single: tuple[list[float], list[float]] = ([], [])
                together: tuple[list[float], list[float]] = ([], [])
                for _ in range(max(3, args.n // 6)):
                    for client, agent, i in ((mine, "bench", 0), (theirs, args.compare_cold_agent, 1)):
                        single[i].extend(await concurrent_creates(client, agent, 2, at_once=1))
                        together[i].extend(await concurrent_creates(client, agent, 1))
                ratio_line("create session (no warm sandbox)", *single)
                ratio_line("4 creates at once, no warm sandbox (each)", *together)


async def settle(*clients: Client, timeout: float = 15) -> None:
    """Each server that reports its pool (`/health`'s `pool.warm`, as ashd's and the reference's
    do) has a warm sandbox again: a round starts after the start its last create set off has ended,
    and a pool that cannot refill stops the run instead of turning its creates cold unseen."""
    for c in clients:
        try:
            warm = await wait_warm(c, 1, timeout)
        except (KeyError, TypeError, RuntimeError, aiohttp.ClientError):
            continue  # no pool in its /health: nothing to wait for
        if not warm:
            raise RuntimeError(f"{c.url} has no warm sandbox after {timeout} s; its log says why")


def ratio_line(row: str, ours: list[float], other: list[float]) -> None:
    a, b = statistics.median(ours), statistics.median(other)
    print(f"{row:<38} {a:7.2f} ({pct(ours, 0.99):6.2f}) ms {b:7.2f} ({pct(other, 0.99):6.2f}) ms {b / a:9.2f}x")


async def script_instant(http: aiohttp.ClientSession, model_url: str) -> None:
    await http.post(model_url + "/_fake/scripts", json={
        "match": "bench-instant", "turns": [{"content": [{"type": "text", "text": "ok"}]}]})


async def lifecycle(c: Client, n: int, prewarmed: bool) -> list[str]:
    label = "pre-warmed sandbox" if prewarmed else "no warm sandbox"
    creates, ids = [], []
    for _ in range(n):
        if prewarmed:
            await wait_warm(c, 1)
        ms, body = await timed(lambda: c.call("POST", "/api/sessions", {"agent": "bench"}))
        creates.append(ms)
        ids.append(body["session"]["id"])
        if len(ids) >= 8:  # keep the pool from filling up
            await c.call("DELETE", f"/api/sessions/{ids.pop(0)}")
    line(f"create session ({label})", creates)
    return ids


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stalled", type=int, default=32, help="streams held stalled at once for the memory row")
    parser.add_argument("--frames", type=int, default=2000, help="text deltas per streamed turn")
    parser.add_argument("--turns", type=int, default=200, help="turns of the long conversation's row")
    parser.add_argument("--mcp", type=int, default=0, metavar="N",
                        help="also N creates of an agent with a stdio MCP server (0: not run)")
    parser.add_argument("--compare", nargs=2, metavar=("URL", "KEY"),
                        help="also run the table's rows against this server, interleaved")
    parser.add_argument("--compare-agent", default="bench", help="an agent deployed on the --compare server")
    parser.add_argument("--compare-cold-agent", metavar="NAME",
                        help="an agent on the --compare server that keeps no warm sandbox: the rows "
                             "without one too (a create, 4 at once), against an ashd with none")
    parser.add_argument("--own-mounts", action="store_true",
                        help="run ashd in a mount namespace of its own (beside a server whose sandboxes "
                             "bind the host's whole mount tree, as the reference's bwrap does)")
    parser.add_argument("--compare-pid", type=int,
                        help="the --compare server's process id, to print its CPU time per operation too")
    parser.add_argument("--postgres", metavar="URL",
                        help="store in PostgreSQL: a fresh database per server on the server URL names "
                             "(e.g. postgresql://postgres@127.0.0.1:5432/test), instead of SQLite")
    args = parser.parse_args()
    global POSTGRES, OWN_MOUNTS
    POSTGRES, OWN_MOUNTS = args.postgres, args.own_mounts
    if args.compare:
        await compare(args)
        return
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        await http.post(model_url + "/_fake/scripts", json={
            "match": "bench-long", "turns": [{"content": [{"type": "text", "text": "x" * (8 * args.frames)}],
                                              "chunk": 8}]})
        async with ashd_server(model_url, prewarm=2) as (url, key, proc):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            table: dict[str, list[float]] = {row: [] for row in TABLE}
            server_cpu = ServerCpu(proc.pid)
            less_model: list[float] = []
            for _ in range(args.n):
                await table_round(c, "bench", table, gets=10, cpu=server_cpu, less_model=less_model)
            for row in TABLE:
                line(row, table[row])
            if less_model:
                line(LESS_MODEL, less_model)
            print("server CPU during each (every thread), p50: " + " · ".join(
                f"{row.split(' (')[0].split(' ->')[0]} {statistics.median(server_cpu.per_row[row]):.2f} ms"
                for row in TABLE) + " (a message: its whole turn)")
            ids = await lifecycle(c, max(3, args.n // 3), prewarmed=True)
            sid = ids[-1]
            cold = []
            for _ in range(max(5, args.n // 3)):
                await c.call("POST", f"/api/sessions/{sid}/stop")
                cold.append((await timed(lambda: c.call("POST", f"/api/sessions/{sid}/resume")))[0])
            line("cold resume (after stop)", cold)
            stops = await stops_during_turns(c, model_url, sid, max(5, args.n // 3))
            line("stop during a turn (a tool running)", stops)
            await long_conversation(c, model_url, args.turns, ServerCpu(proc.pid))
            await mcp_agent(c, args.mcp)
        async with ashd_server(model_url, prewarm=0) as (url, key, _proc):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            await lifecycle(c, max(10, args.n // 2), prewarmed=False)
            line("4 creates at once, no warm sandbox (each)", await concurrent_creates(c, "bench", max(3, args.n // 6)))
        async with ashd_server(model_url, prewarm=args.concurrency) as (url, key, proc):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            sids = [(await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]
                    for _ in range(args.concurrency)]
            await c.stream(sids[0], "warm-up")
            cpu0 = sum(proc.cpu_times()[:2])
            t0 = time.perf_counter()
            frames = await c.stream(sids[0], "bench-long", partial=True)
            wall = time.perf_counter() - t0
            cpu = sum(proc.cpu_times()[:2]) - cpu0
            print(f"{'server CPU per streamed frame':<42} {cpu / frames * 1000:8.3f} ms   "
                  f"({frames} frames, one session, {frames / wall:,.0f} frames/s end to end)")
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(c.stream(s, "bench-long", partial=True) for s in sids))
            wall = time.perf_counter() - t0
            print(f"{'throughput, ' + str(len(sids)) + ' concurrent sessions':<42} "
                  f"{sum(counts) / wall:8,.0f} frames/s  ({sum(counts)} frames in {wall:.2f} s)")
            sids += [(await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]
                     for _ in range(max(0, args.stalled - len(sids)))]
            await stalled_stream(url, key, sids[:max(1, args.stalled)], proc)


async def stops_during_turns(c: Client, model_url: str, sid: str, rounds: int) -> list[float]:
    """ms of a stop sent while a turn's Bash tool runs: the turn is interrupted and stored, then the
    workspace snapshotted and the sandbox let go. The session is resumed (cold) between rounds."""
    await c.http.post(model_url + "/_fake/scripts", json={"match": "bench-tool", "turns": [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "sleep 30"}}]},
        {"content": [{"type": "text", "text": "never reached"}]}]})
    out = []
    for _ in range(rounds):
        await c.call("POST", f"/api/sessions/{sid}/resume")
        async with c.http.post(f"{c.url}/api/sessions/{sid}/messages", headers=c.headers,
                               json={"content": "bench-tool"}) as resp:
            async for raw in resp.content:  # the tool's call has come: it runs
                if raw.startswith(b"data:") and b'"tool_use"' in raw:
                    break
            await asyncio.sleep(0.05)
            out.append((await timed(lambda: c.call("POST", f"/api/sessions/{sid}/stop")))[0])
            async for _ in resp.content:  # its error and done
                pass
    return out


async def long_conversation(c: Client, model_url: str, turns: int, cpu: ServerCpu) -> None:
    """One session's first frames as its conversation grows: every model call sends all of it, so
    what a call costs with its size shows here (docs/performance.md, thirtieth pass). The fake
    model's record of requests is emptied as it goes: kept, its own collector's passes over them
    stalled it 40-70 ms now and then by the 200th turn."""
    if turns < 40:
        return
    sid = (await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]
    firsts: list[float] = []
    row = TABLE[5]
    for i in range(turns):
        with cpu.during(row):
            firsts.append(await first_message_frame(c, sid, f"bench-instant {i} " + "words " * 72))
        if i % 20 == 19:
            await c.http.delete(model_url + "/_fake/requests")
    spent = cpu.per_row[row]
    for label, part in (("1-20", slice(0, 20)), (f"{turns - 19}-{turns}", slice(-20, None))):
        line(f"first frame, conversation turns {label}", firsts[part],
             f"  server CPU {statistics.median(spent[part]):.2f} ms/turn")
    await c.call("DELETE", f"/api/sessions/{sid}")


MCP_SERVER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mcp_echo_server.py"


async def mcp_agent(c: Client, rounds: int) -> None:
    """A create of an agent with one stdio MCP server (`tests/fixtures/mcp_echo_server.py`, run with
    the server's Python), and the first frame of a message sent as soon as it answered: the engine
    starts its MCP servers in the background, and a query waits for those still starting."""
    if rounds <= 0:
        return
    files = [{"path": "AGENT.md", "content": "You benchmark."},
             {"path": "mcp_echo.py", "content": MCP_SERVER.read_text()},
             {"path": ".mcp.json", "content": json.dumps(
                 {"mcpServers": {"echo": {"command": PY, "args": ["/workspace/mcp_echo.py"]}}})}]
    await c.call("POST", "/api/agents", {"name": "bench-mcp", "files": files})
    creates, firsts = [], []
    for _ in range(rounds):
        await warm_if_known(c)
        ms, body = await timed(lambda: c.call("POST", "/api/sessions", {"agent": "bench-mcp"}))
        creates.append(ms)
        sid = body["session"]["id"]
        firsts.append(await first_message_frame(c, sid, "bench-instant"))
        await c.call("DELETE", f"/api/sessions/{sid}")
    line("create session, agent with a stdio MCP server", creates)
    line("  then a message's first frame at once", firsts)


async def stalled_stream(url: str, key: str, sids: list[str], proc: psutil.Process) -> None:
    """Clients that read the headers and then nothing: what the server holds for each. One stream's
    growth of the server's RSS is within the allocator's noise (a few hundred KiB either way between
    runs, seen up to 1.5 MiB), so one stalled stream per session is held at once (32 by default) and
    the growth is divided among them."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"content": "bench-long", "includePartialMessages": True}).encode()
    rss0 = proc.memory_info().rss
    writers = []
    for sid in sids:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(f"POST /api/sessions/{sid}/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        writers.append(writer)
    await asyncio.sleep(3)  # the bridges are paused by now; nothing more is read
    held = max(0, proc.memory_info().rss - rss0)
    conns = [c for c in proc.net_connections("tcp") if c.laddr and c.laddr.port == int(port) and c.raddr]
    print(f"{'memory held by a stalled stream':<42} {held / len(sids) / 1024:8.0f} KiB server RSS growth each "
          f"({len(sids)} stalled at once, {held / 1024:,.0f} KiB in all; {len(conns)} open client connection(s); "
          f"kernel send buffer capped at 32 KiB)")
    for writer in writers:
        writer.close()


if __name__ == "__main__":
    asyncio.run(main())
