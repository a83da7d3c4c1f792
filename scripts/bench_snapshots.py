"""Snapshot and restore time of a ~50 MB workspace (gzip level 1 by default).

    .venv/bin/python scripts/bench_snapshots.py [--mb 50] [--level 1] [--runs 3]

The workspace mixes source-like text (many small files, compressible) and binary blobs
(incompressible), 30/70 by bytes, plus a node_modules tree that the exclusions skip.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from ashd.storage._files import list_files
from ashd.storage._snapshots import restore_workspace, snapshot_workspace
from ashd.storage._snapshots_reader import SnapshotReader

WORDS = ("def", "return", "import", "class", "self", "value", "for", "in", "if", "else", "None", "print")


def build(root: Path, total_mb: int) -> tuple[int, int]:
    rng = random.Random(1)
    text_bytes = total_mb * 1024 * 1024 * 3 // 10
    blob_bytes = total_mb * 1024 * 1024 - text_bytes
    files = 0
    written = 0
    while written < text_bytes:
        path = root / f"src/pkg{files // 100}/mod{files}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "\n".join(" ".join(rng.choices(WORDS, k=12)) for _ in range(rng.randint(20, 200)))
        path.write_text(body)
        written += len(body)
        files += 1
    for i in range(max(1, blob_bytes // (2 * 1024 * 1024))):
        (root / "assets").mkdir(exist_ok=True)
        (root / "assets" / f"blob{i}.bin").write_bytes(os.urandom(2 * 1024 * 1024))
        files += 1
    for i in range(500):
        p = root / f"node_modules/dep{i % 20}/f{i}.js"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("module.exports = 1;\n" * 50)
    return files, sum(f.size for f in list_files(root))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        files, size = build(ws, args.mb)
        print(f"workspace: {files} files, {size / 1e6:.1f} MB (excluding node_modules)")
        snap_t, restore_t, list_t = [], [], []
        for run in range(args.runs):
            t0 = time.perf_counter()
            info = snapshot_workspace(ws, Path(tmp) / "snaps" / "s", "s", compresslevel=args.level)
            snap_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with SnapshotReader(info.path) as reader:
                listed = len(reader.list_files())
            list_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            restore_workspace(info, Path(tmp) / f"restored{run}")
            restore_t.append(time.perf_counter() - t0)
        print(f"snapshot: {info.size / 1e6:.1f} MB tar.gz (level {args.level}), {listed} files listed")
        runs = [round(t, 2) for t in snap_t]
        print(f"snapshot time  median {statistics.median(snap_t):.2f} s  (runs {runs})")
        print(f"reader list    median {statistics.median(list_t):.2f} s")
        print(f"restore time   median {statistics.median(restore_t):.2f} s")


if __name__ == "__main__":
    main()
