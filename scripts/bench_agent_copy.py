"""Agent folder copy into a workspace, and the path-deploy policy check.

    .venv/bin/python scripts/bench_agent_copy.py [--files 200] [--n 50]

Prints figures; asserts nothing. Compares the descriptor walk that never follows a symlink
(`copy_agent`, used since the agent-path hardening) with `shutil.copytree(symlinks=True)` (used
before it) on a folder of AGENT.md plus `--files` 4 KiB skill files, and a one-file folder; then the
cost of `AgentPathPolicy.check` at deploy time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ashd.sandboxing._agent_setup import copy_agent
from ashd.storage._agent_paths import AgentPathPolicy


def _percentiles(fn: Callable[[int], object], n: int) -> tuple[float, float]:
    times = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[n // 2] * 1000, times[int(n * 0.9)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ashd-bench-copy-", dir="/tmp"))
    try:
        big = root / "agent"
        (big / ".agent" / "skills").mkdir(parents=True)
        (big / "AGENT.md").write_text("p" * 2000)
        for i in range(args.files):
            (big / ".agent" / "skills" / f"s{i}.md").write_text("x" * 4096)
        small = root / "small"
        small.mkdir()
        (small / "AGENT.md").write_text("hi")
        for label, src in ((f"{args.files + 1} files", big), ("1 file", small)):
            for name, copy in (("copy_agent (fd walk)", copy_agent),
                               ("shutil.copytree (before)", lambda s, d: shutil.copytree(s, d, symlinks=True))):
                def run(i: int, copy: Callable[[Path, Path], object] = copy, src: Path = src) -> None:
                    target = root / f"ws-{i}"
                    copy(src, target)
                    shutil.rmtree(target)

                p50, p90 = _percentiles(run, args.n)
                print(f"{name:26s} {label:10s} p50 {p50:8.3f} ms  p90 {p90:8.3f} ms  (copy + rmtree)")
        policy = AgentPathPolicy(root / "data")
        p50, p90 = _percentiles(lambda _i: policy.check(str(big), "default"), 500)
        print(f"{'AgentPathPolicy.check':26s} {'deploy':10s} p50 {p50:8.3f} ms  p90 {p90:8.3f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
