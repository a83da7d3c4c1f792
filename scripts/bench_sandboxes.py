"""Pool benchmarks: create latency (pre-warmed vs fresh), memory per idle sandbox, sandboxes per host.

    .venv/bin/python scripts/bench_sandboxes.py [--n 40] [--idle 200] [--deadline 240]

Prints figures; asserts nothing. Three parts:
1. PoolActor.claim latency with a real launcher (zygote): a pre-warmed claim, a fresh claim
   (returns once launched) and fresh claim + bridge ready (what a session then waits for).
2. `POST /api/sessions` on a real server (aiohttp, SQLite, the fake model), pre-warmed and not:
   the targets are ≤ 4 ms with a warm sandbox and ≤ 30 ms without; and with a disk size (`diskMb`)
   other than the pre-warmed sandboxes', which always takes a fresh sandbox.
3. N idle bridge sandboxes launched through the zygote: PSS per sandbox (psutil, all of its
   processes) and cgroup memory, extrapolated to 24 GiB and to this host's memory. The part is
   bounded by --deadline seconds; everything started is cleaned up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ashd.actors._pool import PoolActor, PoolConfig
from ashd.actors._readiness import wait_bridge_ready
from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits, SandboxProcess, SandboxSpec

LIMITS = SandboxLimits(memory_bytes=512 * 1024 * 1024, pids=256, cpu_cores=1.0)
GIB = 1024**3
MIB = 1024**2


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def line(label: str, values: list[float]) -> str:
    return (f"{label:44s} n={len(values):3d}  p50 {pct(values, 0.5):7.2f} ms  p99 {pct(values, 0.99):7.2f} ms"
            f"  mean {statistics.mean(values) * 1000:7.2f} ms")


def wait(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.002)


def _has_warm(board: Any) -> bool:
    return bool(board.read()["warm"] >= 1)


# --- 1. PoolActor --------------------------------------------------------------------------------
def bench_pool(data: Path, n: int) -> None:
    launcher = SandboxLauncher(LauncherConfig(data / "pool", LIMITS, use_zygote=True))
    launcher.start()

    def spec_for(sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id, launcher.paths_for(sandbox_id), env={"LANG": "C.UTF-8"}, limits=LIMITS,
                           network=network)

    try:
        for prewarm in (1, 0):
            ref = PoolActor.start(PoolConfig(max_capacity=8, prewarm=prewarm, idle_timeout=3600.0, shutdown_grace=2.0),
                                  launcher, spec_for, None, lambda lost: None)
            pool = ref.proxy()
            board = pool.board.get(timeout=30)
            claim_t: list[float] = []
            ready_t: list[float] = []
            for i in range(n):
                if prewarm:
                    wait(functools.partial(_has_warm, board))
                t0 = time.perf_counter()
                handle = pool.claim("bench", f"s{i}").get(timeout=60)
                claim_t.append(time.perf_counter() - t0)
                if not prewarm:
                    wait_bridge_ready(handle.paths.bridge_socket, 60)
                    ready_t.append(time.perf_counter() - t0)
                pool.release(handle.sandbox_id, True).get(timeout=60)
            if prewarm:
                print(line("PoolActor.claim, pre-warmed", claim_t))
            else:
                print(line("PoolActor.claim, fresh (launched)", claim_t))
                print(line("PoolActor.claim, fresh + bridge ready", ready_t))
            ref.stop(block=True, timeout=60)
    finally:
        launcher.stop()


# --- 2. POST /api/sessions ------------------------------------------------------------------------
async def bench_http(data: Path, n: int) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from ashd.app import Server
    from ashd.config import Settings
    from ashd.devtools.fake_model import FakeModel

    fake = FakeModel()
    await fake.start()
    try:
        for prewarm in (1, 0):
            settings = Settings(data_dir=str(data / f"http{prewarm}"), prewarm=prewarm, zygote=True,
                                anthropic_base_url=fake.url, anthropic_api_key="sk-bench",
                                rate_limit_rps=100000.0, rate_limit_burst=100000, max_sandboxes=8)
            server = Server(settings)
            await server.start_components()
            assert server.app is not None
            client: TestClient[Any, Any] = TestClient(TestServer(server.app))
            await client.start_server()
            key = (Path(settings.data_dir) / "initial-api-key").read_text().strip()
            headers = {"Authorization": f"Bearer {key}"}
            try:
                resp = await client.post("/api/agents", json={"name": "bench", "systemPrompt": "hi"},
                                         headers=headers)
                assert resp.status == 201, await resp.text()
                times: list[float] = []
                for _ in range(n):
                    if prewarm:
                        while True:
                            health = await (await client.get("/health")).json()
                            if health["pool"]["warm"] >= 1:
                                break
                            await asyncio.sleep(0.005)
                    t0 = time.perf_counter()
                    resp = await client.post("/api/sessions", json={"agent": "bench"}, headers=headers)
                    body = await resp.json()
                    times.append(time.perf_counter() - t0)
                    assert resp.status == 201, body
                    resp = await client.delete(f"/api/sessions/{body['session']['id']}", headers=headers)
                    assert resp.status == 200
                label = "pre-warmed sandbox" if prewarm else "no warm sandbox"
                print(line(f"POST /api/sessions, {label}", times))
                if prewarm and "sandbox_disk_mb" in Settings.__dataclass_fields__:
                    # Another disk size than the pre-warmed ones have: always a fresh sandbox and disk.
                    sized: list[float] = []
                    for _ in range(n):
                        t0 = time.perf_counter()
                        resp = await client.post("/api/sessions", json={"agent": "bench", "diskMb": 512},
                                                 headers=headers)
                        body = await resp.json()
                        sized.append(time.perf_counter() - t0)
                        assert resp.status == 201, body
                        resp = await client.delete(f"/api/sessions/{body['session']['id']}", headers=headers)
                        assert resp.status == 200
                    print(line("POST /api/sessions, diskMb other than default", sized))
            finally:
                await client.close()
                await server.stop()
    finally:
        await fake.stop()


# --- 3. idle sandboxes ----------------------------------------------------------------------------
def bench_idle(data: Path, count: int, deadline_s: float) -> None:
    launcher = SandboxLauncher(LauncherConfig(data / "idle", LIMITS, use_zygote=True))
    launcher.start()
    procs: list[SandboxProcess] = []
    deadline = time.monotonic() + deadline_s
    available_before = psutil.virtual_memory().available
    try:
        t0 = time.perf_counter()
        for i in range(count):
            if time.monotonic() > deadline:
                print(f"deadline reached after {i} sandboxes")
                break
            sid = f"idle{i:04d}"
            paths = launcher.prepare(sid)
            procs.append(launcher.launch(SandboxSpec(sid, paths, env={"LANG": "C.UTF-8"}, limits=LIMITS)))
            if not wait_bridge_ready(paths.bridge_socket, max(1.0, deadline - time.monotonic())):
                print(f"sandbox {sid} did not become ready before the deadline")
                break
        launched = len(procs)
        print(f"launched {launched} idle bridge sandboxes (bridge ready) in {time.perf_counter() - t0:.1f} s")
        if not launched:
            return
        pss = [p.pss_bytes() for p in procs]
        cgroup = [p.memory_bytes() for p in procs]
        available_after = psutil.virtual_memory().available
        per_pss = statistics.mean(pss)
        per_cg = statistics.mean(cgroup)
        per_host = (available_before - available_after) / launched
        host_total = psutil.virtual_memory().total
        print(f"PSS per idle sandbox: mean {per_pss / MIB:.1f} MiB (min {min(pss) / MIB:.1f},"
              f" max {max(pss) / MIB:.1f}); total {sum(pss) / GIB:.2f} GiB for {launched}")
        print(f"cgroup memory per idle sandbox: mean {per_cg / MIB:.1f} MiB (includes page cache charged to it)")
        print(f"host 'available' memory drop per sandbox: {per_host / MIB:.1f} MiB")
        zygote = _zygote_pss()
        print(f"zygote (shared by all): PSS {zygote / MIB:.1f} MiB")
        for label, mem in (("24 GiB", 24 * GIB), (f"this host ({host_total / GIB:.1f} GiB)", host_total)):
            print(f"idle sandboxes that fit in {label}: by PSS {int((mem - zygote) // per_pss)},"
                  f" by host available-drop {int((mem - zygote) // max(per_host, 1))},"
                  f" by cgroup memory {int((mem - zygote) // max(per_cg, 1))}")
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.cleanup()
        launcher.stop()


def _zygote_pss() -> int:
    total = 0
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "ashd.zygote._fork_server" in cmd and proc.ppid() == psutil.Process().pid:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_full_info().pss
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40, help="samples per latency figure")
    parser.add_argument("--idle", type=int, default=200, help="idle sandboxes to launch")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds allowed for the idle part")
    parser.add_argument("--skip", choices=("pool", "http", "idle"), action="append", default=[])
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="ashd-bs-", dir="/tmp"))
    try:
        if "pool" not in args.skip:
            bench_pool(data, args.n)
        if "http" not in args.skip:
            asyncio.run(bench_http(data, args.n))
        if "idle" not in args.skip:
            bench_idle(data, args.idle, args.deadline)
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
