"""A first message's bridge part: a query sent to the bridge, to its first `message` frame back.

    .venv/bin/python scripts/bench_bridge.py [--n 200] [--grow 300]

The bridge runs as its own process (`python -m ashd.bridge`, no sandbox); the model proxy and the
fake model run in this process, as `tests/fixtures/bridge_fixture.py` wires them. Reported, p50
and p99:
- the fake model alone, and through the proxy, from this process with aiohttp (the first byte of
  an instant reply): what the bridge waits for on each call, less the wake-ups of a second process
  (timed inside the bridge, that wait was 0.5-1 ms longer: docs/performance.md);
- a query sent to its first `message` frame, and to its `done`, with a fresh conversation (a new
  `init` every 20 queries);
- the first frame as the conversation grows by two messages a query (`--grow` queries without a new
  `init`), at four points, with the size of the request body the fake model got there;
- on each query row, the bridge process's CPU per query (its process CPU clock, every thread), the
  part of the row that is the bridge's own work whatever the fake model in this process costs.
Prints figures; asserts nothing (docs/performance.md, twenty-second pass).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from ashd._heap import settle
from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing._bridge_client import BridgeConnection
from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, SessionModels
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.sandboxing._types import SandboxPaths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import ServerCpu

KEY = "sk-ant-bench-0123456789"
MODEL = "claude-fake-model"
PROMPT = "bench-instant"
RESET_EVERY = 20


def line(label: str, values: list[float], extra: str = "") -> None:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"{label:<52} p50 {statistics.median(values):7.3f} ms   p99 {p99:7.3f} ms   (n={len(values)}){extra}")


async def model_alone(url: str, connector: aiohttp.BaseConnector | None, n: int) -> list[float]:
    body = {"model": MODEL, "max_tokens": 1024, "stream": True, "system": "You are a test agent.",
            "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    firsts: list[float] = []
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            async with http.post(url, json=body, headers=headers) as resp:
                async for _chunk in resp.content.iter_any():
                    firsts.append((time.perf_counter() - t0) * 1000)
                    break
                await resp.read()
            await asyncio.sleep(0.002)
    return firsts


def cpu_ms(pid: int) -> float:
    """Process `pid`'s CPU time so far, in ms (`bench_sessions.ServerCpu`'s clock)."""
    return ServerCpu(pid).seconds() * 1000


async def query(conn: BridgeConnection, qid: str) -> tuple[float, float]:
    """ms to the first `message` frame, and to `done`."""
    t0 = time.perf_counter()
    first: float | None = None
    async for frame in conn.query(PROMPT, query_id=qid):
        if first is None and frame["type"] == "message":
            first = (time.perf_counter() - t0) * 1000
    done = (time.perf_counter() - t0) * 1000
    return (first if first is not None else done), done


async def main(n: int, grow: int) -> None:
    fake = FakeModel()
    await fake.start()
    root = Path(tempfile.mkdtemp(prefix="ashd-bb-", dir="/tmp"))  # short: a socket path is at most 108 bytes
    paths = SandboxPaths(root)
    for d in (paths.workspace, paths.home, paths.run):
        d.mkdir(parents=True)
    (paths.workspace / "AGENT.md").write_text("You are a test agent.\n")
    proxy = ModelProxy(fake.url, policy=ModelPolicy.open())
    await proxy.start_for("bench", str(paths.model_socket))
    proxy.bind("bench", ModelBinding("bench-session", "bench", "bench", SessionModels(MODEL), key=lambda: KEY))
    proxy.begin_turn("bench", "bench-turn", None, None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env["HOME"] = str(paths.home)
    settle()  # as the server does once started (ashd/_heap.py): its collector's full passes stay short
    bridge = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ashd.bridge", "--socket", str(paths.bridge_socket), "--model-socket",
        str(paths.model_socket), "--workspace", str(paths.workspace), env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        line("the fake model alone: first byte", await model_alone(f"{fake.url}/v1/messages", None, n))
        line("through the model proxy: first byte",
             await model_alone("http://proxy/v1/messages", aiohttp.UnixConnector(path=str(paths.model_socket)), n))
        conn = await BridgeConnection.connect(str(paths.bridge_socket), 30)
        firsts, dones = [], []
        cpu0 = cpu_ms(bridge.pid)
        for i in range(n):
            if i % RESET_EVERY == 0:
                await conn.init({"model": MODEL})
            first, done = await query(conn, f"fresh-{i}")
            firsts.append(first)
            dones.append(done)
            await asyncio.sleep(0.002)
        fresh_cpu = f"  bridge CPU {(cpu_ms(bridge.pid) - cpu0) / max(n, 1):.3f} ms/query"
        line(f"query -> first message frame (new init every {RESET_EVERY})", firsts, fresh_cpu)
        line("query -> done", dones)
        await conn.init({"model": MODEL})
        grown: list[float] = []
        marks = sorted({0, grow // 3, 2 * grow // 3, grow - RESET_EVERY})
        cpu0 = 0.0
        for i in range(grow):
            if i in marks:
                cpu0 = cpu_ms(bridge.pid)
            grown.append((await query(conn, f"grow-{i}"))[0])
            await asyncio.sleep(0.002)
            if i - RESET_EVERY + 1 in marks:
                start = i - RESET_EVERY + 1
                size = len(json.dumps(fake.requests[-1]["body"]).encode())
                per_query = (cpu_ms(bridge.pid) - cpu0) / RESET_EVERY
                line(f"  the same, messages {2 * start + 1}-{2 * i + 1} in the request",
                     grown[start:i + 1], f"  body {size / 1024:.1f} KiB, bridge CPU {per_query:.3f} ms/query")
            if (i + 1) % RESET_EVERY == 0:  # the fake keeps every request: a heap its collector walks
                fake.reset()
        await conn.close()
    finally:
        bridge.terminate()
        await bridge.wait()
        await proxy.close()
        await fake.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200,
                        help="queries with a fresh conversation, and calls of each model row")
    parser.add_argument("--grow", type=int, default=300, help="queries in one growing conversation (0: none)")
    args = parser.parse_args()
    asyncio.run(main(args.n, max(args.grow, 0)))
