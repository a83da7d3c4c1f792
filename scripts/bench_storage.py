"""Costs of the storage bounds, printed as figures.

    .venv/bin/python scripts/bench_storage.py

1. What a tenant holds (`TenantStorage.holdings`, the sum behind GET /api/storage and the 409
   check) for a tenant with 1,000 and 10,000 sessions on SQLite; and the cached pre-check that the
   message path pays.
2. `statvfs` on the data dir (paid by every request that adds data, for the reserve).
3. A snapshot refused for size: a workspace holding a 20 GiB sparse file under a 1 GiB limit.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert
from sqlalchemy.orm import Session as SyncSession

from ashd.config import Settings
from ashd.errors import PayloadTooLarge
from ashd.storage import Database, Session
from ashd.storage._diskspace import DataDirSpace
from ashd.storage._holdings import TenantStorage
from ashd.storage._snapshots import SnapshotBoard, snapshot_workspace


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def holdings(tmp: Path) -> None:
    db = await Database.open(f"sqlite+aiosqlite:///{tmp / 'bench.db'}")
    board = SnapshotBoard()
    store = TenantStorage(db, board, Settings())
    made = 0
    try:
        for target in (1_000, 10_000):
            ids = [f"{i:08d}-0000-0000-0000-000000000000" for i in range(made, target)]
            rows: list[dict[str, object]] = [
                {"id": sid, "tenant_id": "t", "agent_name": "a", "config": "{}", "message_count": 10,
                 "event_count": 30, "stored_bytes": 5000} for sid in ids]

            def add(s: SyncSession, rows: list[dict[str, object]] = rows) -> None:
                s.execute(insert(Session), rows)

            await db.run_tx(add)
            made = target
            # Every session has snapshots (the costlier case: their ids are read for the board).
            board._by_session.update({sid: (3, 100_000) for sid in ids})
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                await store.holdings("t")
                times.append(time.perf_counter() - t0)
            cached = []
            for _ in range(200):
                t0 = time.perf_counter()
                await store.require_room("t", "a message")
                cached.append(time.perf_counter() - t0)
            print(f"holdings, {target:>6} sessions: p50 {ms(statistics.median(times))}, max {ms(max(times))}; "
                  f"cached pre-check p50 {ms(statistics.median(cached))}")
    finally:
        await db.close()


def statvfs(tmp: Path) -> None:
    space = DataDirSpace(tmp, 0, 0)
    n = 10_000
    t0 = time.perf_counter()
    for _ in range(n):
        space.measure()
    print(f"statvfs + state on the data dir: {(time.perf_counter() - t0) / n * 1e6:.1f} µs per check")


def refusal(tmp: Path) -> None:
    ws = tmp / "workspace"
    ws.mkdir()
    (ws / "small.txt").write_text("hello\n")
    with (ws / "sparse.bin").open("wb") as fh:
        fh.truncate(20 * 1024 ** 3)
    t0 = time.perf_counter()
    refused = False
    try:
        snapshot_workspace(ws, tmp / "snaps", "bench", max_bytes=1024 ** 3)
    except PayloadTooLarge:
        refused = True
    left = os.listdir(tmp / "snaps")
    print(f"snapshot of a 20 GiB sparse file under a 1 GiB limit: refused={refused} in "
          f"{ms(time.perf_counter() - t0)}; files left behind: {len(left)}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ashd-bench-") as raw:
        tmp = Path(raw)
        asyncio.run(holdings(tmp))
        statvfs(tmp)
        refusal(tmp)


if __name__ == "__main__":
    main()
