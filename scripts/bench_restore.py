"""Snapshot restore: ashd's own extraction (`_untar`, every Python) against the standard library's
`data` filter (Python 3.11.4+ only), alternating on one snapshot. CPU time of this process, which
a busy machine disturbs less than wall time.

    .venv/bin/python scripts/bench_restore.py [--mb 10] [--runs 12]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_snapshots import build  # beside this file (scripts/ is the first sys.path entry)

from ashd.storage import _untar
from ashd.storage._files import is_excluded
from ashd.storage._snapshots import snapshot_workspace


def stdlib(snapshot: Path, dest: Path) -> None:
    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        safe = tarfile.data_filter(member, path)  # type: ignore[attr-defined]
        return None if is_excluded(safe.name.rstrip("/")) else safe

    with tarfile.open(snapshot, "r:*") as tf:
        for member in tf:
            tf.extract(member, dest, filter=keep)  # type: ignore[call-arg]


def ours(snapshot: Path, dest: Path) -> None:
    with tarfile.open(snapshot, "r:*") as tf:
        _untar.extract(tf, dest, keep=lambda rel: not is_excluded(rel))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=10)
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ashd-bench-restore-"))
    try:
        files, _ = build(tmp / "ws", args.mb)
        info = snapshot_workspace(tmp / "ws", tmp / "snaps", "s1")
        ways: dict[str, Callable[[Path, Path], None]] = {"_untar": ours}
        if hasattr(tarfile, "data_filter"):
            ways["tarfile data filter"] = stdlib
        times: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(args.runs):
            for name, way in ways.items():
                dest = tmp / f"dest-{i}-{len(times[name])}-{name[:3]}"
                dest.mkdir()
                started = time.process_time()
                way(info.path, dest)
                times[name].append(time.process_time() - started)
                shutil.rmtree(dest)
        print(f"snapshot: {files} files, {info.size / 1e6:.1f} MB tar.gz")
        for name, values in times.items():
            print(f"{name:>20}: median {statistics.median(values):.3f} s CPU over {len(values)} runs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
