"""What network costs a sandbox: launch latency with and without `network`, and teardown. Prints
figures; asserts nothing.

    .venv/bin/python scripts/bench_sandbox_network.py [--n 50]

Launch = launch() called -> the sandboxed program (`python -I -S`) connects to a Unix socket in
its /run/ashd. With network that includes the netns, the veth pair, the /31 claim, addresses and
routes; the first networked launch of a server also installs the egress table (reported apart).
Teardown = cleanup() of a sandbox that already exited (with network: the veth and netns removal
and the conntrack flush). "plumbing" times the network part alone, without a sandbox.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits, SandboxSpec
from ashd.sandboxing._egress_policy import EgressPolicy
from ashd.sandboxing._network import SandboxNetworking

LIMITS = SandboxLimits(memory_bytes=256 * 1024 * 1024, pids=64, cpu_cores=1.0)
CONNECT = "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/ashd/bench.sock'); s.sendall(b'hi')"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def _one(launcher: SandboxLauncher, sid: str, network: bool) -> tuple[float, float]:
    paths = launcher.prepare(sid)
    path = paths.run / "bench.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    os.chmod(path, 0o666)  # the sandbox uid must be allowed to connect
    srv.listen(1)
    srv.settimeout(120)
    spec = SandboxSpec(sid, paths, limits=LIMITS, network=network, argv=(sys.executable, "-I", "-S", "-c", CONNECT))
    t0 = time.perf_counter()
    proc = launcher.launch(spec)
    conn, _ = srv.accept()
    conn.recv(2)
    launched = time.perf_counter() - t0
    conn.close()
    srv.close()
    proc.wait(30)
    t0 = time.perf_counter()
    proc.cleanup()
    torn_down = time.perf_counter() - t0
    launcher.destroy_dirs(sid)
    return launched, torn_down


def bench(route: str, n: int, data_dir: Path) -> None:
    launcher = SandboxLauncher(LauncherConfig(data_dir / route, LIMITS, use_zygote=route == "zygote"))
    launcher.start()
    try:
        first, _ = _one(launcher, "first", True)
        print(f"[{route}] first networked launch (installs the egress table): {first * 1000:.1f} ms")
        for _ in range(3):  # warm-up, as the first sandboxes of a route pay imports and page faults
            _one(launcher, "warm", False)
        for network in (False, True):
            launches, teardowns = [], []
            for i in range(n):
                launched, torn_down = _one(launcher, f"s{i}", network)
                launches.append(launched)
                teardowns.append(torn_down)
            label = "network   " if network else "no network"
            print(f"[{route}] {label} n={n}  launch p50 {_pct(launches, 0.5):6.1f} ms"
                  f"  p99 {_pct(launches, 0.99):6.1f} ms  |  teardown p50 {_pct(teardowns, 0.5):6.1f} ms"
                  f"  p99 {_pct(teardowns, 0.99):6.1f} ms")
    finally:
        launcher.stop()


def bench_plumbing(n: int, data_dir: Path) -> None:
    """The network part alone: attach (netns, veth, claim, addresses, routes) and release."""
    net = SandboxNetworking(data_dir / "plumbing", EgressPolicy())
    net.start()
    try:
        t0 = time.perf_counter()
        net.attach("first")
        print(f"[plumbing] first attach (installs the egress table): {(time.perf_counter() - t0) * 1000:.1f} ms")
        net.release("first")
        attaches, releases = [], []
        for i in range(n):
            t0 = time.perf_counter()
            net.attach(f"s{i}")
            attaches.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            net.release(f"s{i}")
            releases.append(time.perf_counter() - t0)
        print(f"[plumbing] n={n}  attach p50 {_pct(attaches, 0.5):6.1f} ms  p99 {_pct(attaches, 0.99):6.1f} ms"
              f"  |  release p50 {_pct(releases, 0.5):6.1f} ms  p99 {_pct(releases, 0.99):6.1f} ms")
    finally:
        net.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="ashd-bench-", dir="/tmp") as tmp:
        bench_plumbing(args.n, Path(tmp))
        for route in ("bwrap", "zygote"):
            bench(route, args.n, Path(tmp))


if __name__ == "__main__":
    main()
