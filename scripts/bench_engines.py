"""Memory of one sandbox per engine: idle (bridge initialised, no turn yet), busy (peak during a
turn: two model calls and a Bash tool call) and idle again after the turn.

    .venv/bin/python scripts/bench_engines.py [--engine builtin] [--turns 3]

Real sandboxes through the zygote (no network), the model proxy on the sandbox's socket and the fake
model. Figures are the sandbox cgroup's memory (what its memory limit counts, page cache included)
and the PSS of its processes (their fair share of pages shared with the zygote). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits, SandboxProcess, SandboxSpec
from ashd.sandboxing._bridge_client import BridgeConnection
from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, SessionModels
from ashd.sandboxing._model_proxy import ModelProxy

LIMITS = SandboxLimits(memory_bytes=2 * 1024**3, pids=256, cpu_cores=1.0)
MIB = 1024**2


class Sampler:
    """Peak cgroup memory and PSS of a sandbox, polled from a thread while a turn runs."""

    def __init__(self, proc: SandboxProcess) -> None:
        self.proc = proc
        self.peak_cgroup = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_cgroup = max(self.peak_cgroup, self.proc.memory_bytes())
            self.peak_pss = max(self.peak_pss, self.proc.pss_bytes())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def figures(proc: SandboxProcess) -> str:
    return f"cgroup {proc.memory_bytes() / MIB:6.1f} MiB  PSS {proc.pss_bytes() / MIB:6.1f} MiB"


async def bench(engine: str, turns: int) -> None:
    loop = asyncio.get_running_loop()
    fake = FakeModel()
    url = await fake.start()
    fake.script("BENCH", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "ls -la /workspace > /dev/null"}}]},
        {"content": [{"type": "text", "text": "bench turn done " * 50}]},
    ])
    data = Path(tempfile.mkdtemp(prefix="ashd-be-", dir="/tmp"))
    launcher = SandboxLauncher(LauncherConfig(data, LIMITS, use_zygote=True))
    await loop.run_in_executor(None, launcher.start)
    proxy = ModelProxy(url, policy=ModelPolicy.open())
    proc: SandboxProcess | None = None
    conn: BridgeConnection | None = None
    try:
        paths = await loop.run_in_executor(None, launcher.prepare, "bench")
        await proxy.start_for("bench", str(paths.model_socket))
        proxy.bind("bench", ModelBinding("bench", "bench", "bench", SessionModels("claude-fake-model"),
                                         key=lambda: "sk-ant-bench-key"))
        proxy.begin_turn("bench", "bench", None, None)
        spec = SandboxSpec("bench", paths, env={"LANG": "C.UTF-8"}, limits=LIMITS)
        proc = await loop.run_in_executor(None, launcher.launch, spec)
        conn = await BridgeConnection.connect(str(paths.bridge_socket), 60)
        await conn.init({"engine": engine, "model": "claude-fake-model"}, timeout=120)
        print(f"[{engine}] idle, initialised:      {figures(proc)}")
        for turn in range(turns):
            with Sampler(proc) as sampler:
                frames = [f async for f in conn.query(f"BENCH turn {turn}")]
            errors = [f for f in frames if f["type"] == "error"]
            if errors:
                print(f"[{engine}] turn {turn} failed: {errors[0].get('error')}")
                return
            print(f"[{engine}] busy, turn {turn} peak:      cgroup {sampler.peak_cgroup / MIB:6.1f} MiB  "
                  f"PSS {sampler.peak_pss / MIB:6.1f} MiB")
            print(f"[{engine}] idle after turn {turn}:     {figures(proc)}")
    finally:
        if conn is not None:
            await conn.close()
        if proc is not None:
            proc.kill()
            proc.cleanup()
        await proxy.close()
        await loop.run_in_executor(None, launcher.stop)
        await fake.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", action="append", help="engine(s) to measure (default: builtin)")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    for engine in args.engine or ["builtin"]:
        asyncio.run(bench(engine, args.turns))


if __name__ == "__main__":
    main()
