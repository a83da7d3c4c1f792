"""Sandbox spawn latency (bwrap vs zygote) and PSS per idle sandbox. Prints figures; asserts nothing.

    .venv/bin/python scripts/bench_sandbox_spawn.py [--n 30] [--idle 8]

Latency = launch() called -> the sandboxed program's first byte arrives on a Unix socket in its
/run/ashd. "trivial" is `python -I -S -c <connect>`; "client" imports the bridge's model client first (what the
bridge pays): cold in bwrap, pre-imported in the zygote.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits, SandboxProcess, SandboxSpec

LIMITS = SandboxLimits(memory_bytes=512 * 1024 * 1024, pids=64, cpu_cores=1.0)
CONNECT = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/ashd/bench.sock'); s.sendall(b'hi')"
)
IDLE = CONNECT + "; s.recv(1)"


def _listen(run_dir: Path) -> socket.socket:
    path = run_dir / "bench.sock"
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    os.chmod(path, 0o666)  # the sandbox uid must be allowed to connect
    srv.listen(1)
    srv.settimeout(120)
    return srv


def _one(
    launcher: SandboxLauncher, sid: str, code: str, flags: tuple[str, ...]
) -> tuple[float, SandboxProcess, socket.socket]:
    paths = launcher.prepare(sid)
    srv = _listen(paths.run)
    spec = SandboxSpec(sid, paths, limits=LIMITS, argv=(sys.executable, *flags, "-c", code))
    t0 = time.perf_counter()
    proc = launcher.launch(spec)
    conn, _ = srv.accept()
    conn.recv(2)
    elapsed = time.perf_counter() - t0
    srv.close()
    return elapsed, proc, conn


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def bench(route: str, n: int, idle: int, data_dir: Path) -> None:
    config = LauncherConfig(data_dir / route, LIMITS, use_zygote=route == "zygote")
    launcher = SandboxLauncher(config)
    t0 = time.perf_counter()
    launcher.start()
    print(f"[{route}] launcher start: {(time.perf_counter() - t0) * 1000:.0f} ms")
    try:
        for label, code, flags, count in (
            ("trivial", CONNECT, ("-I", "-S"), n),
            ("client", "import ashd.bridge.engine._model_client; " + CONNECT, ("-I",), max(3, n // 6)),
        ):
            times = []
            for i in range(count):
                elapsed, proc, conn = _one(launcher, f"{label}{i}", code, flags)
                times.append(elapsed)
                conn.close()
                proc.wait(30)
                proc.cleanup()
                launcher.destroy_dirs(f"{label}{i}")
            print(
                f"[{route}] spawn {label:9s} n={count:3d}  p50 {_pct(times, 0.5):7.1f} ms"
                f"  p99 {_pct(times, 0.99):7.1f} ms  mean {statistics.mean(times) * 1000:7.1f} ms"
            )
        procs = []
        for i in range(idle):
            _, proc, conn = _one(launcher, f"idle{i}", "import ashd.bridge.engine._model_client; " + IDLE, ("-I",))
            procs.append((proc, conn))
        pss = [p.pss_bytes() for p, _ in procs]
        mem = [p.memory_bytes() for p, _ in procs]
        print(
            f"[{route}] idle sandboxes with the model client imported, n={idle}: PSS per sandbox"
            f" {statistics.mean(pss) / 2**20:.1f} MiB"
            f" (min {min(pss) / 2**20:.1f}, max {max(pss) / 2**20:.1f});"
            f" cgroup memory {statistics.mean(mem) / 2**20:.1f} MiB"
        )
        for i, (proc, conn) in enumerate(procs):
            conn.close()
            proc.kill()
            proc.wait(30)
            proc.cleanup()
            launcher.destroy_dirs(f"idle{i}")
    finally:
        launcher.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--idle", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ashd-bench-") as tmp:
        for route in ("bwrap", "zygote"):
            bench(route, args.n, args.idle, Path(tmp))


if __name__ == "__main__":
    main()
