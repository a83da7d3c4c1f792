"""SQLite's WAL checkpoints taken by their own thread in quiet moments (storage/_checkpoint.py), on a
real database file: what was committed reaches the database file itself, and not before the front
end is quiet."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from ashd.storage import Database, Session, WalCheckpointer
from ashd.storage._sessions import Sessions


def _in_database_file(path: Path) -> int:
    """Sessions in the database file alone: `immutable` reads it without its write-ahead log.

    `immutable` also means without locks, so a read that meets a checkpoint copying pages into the
    file can see half of them ("malformed"); it reads again once the copy is through."""
    for _ in range(200):
        conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
        try:
            return int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])
        except sqlite3.OperationalError:  # no such table: the schema itself is still only in the log
            return 0
        except sqlite3.DatabaseError:  # a torn read, not a torn file
            time.sleep(0.01)
        finally:
            conn.close()
    raise AssertionError(f"{path} stayed unreadable for 2 s")


def _wait(cond: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


async def test_committed_rows_reach_the_database_file_in_a_quiet_moment(tmp_path: Path) -> None:
    path = tmp_path / "ashd.db"
    db = await Database.open(f"sqlite+aiosqlite:///{path}")
    assert db.sqlite_file == path
    quiet = threading.Event()
    asked: list[float] = []

    def is_quiet() -> bool:
        asked.append(time.monotonic())
        return quiet.is_set()

    checkpoints = WalCheckpointer(path, is_quiet, interval_s=0.02, at_most_s=60)
    checkpoints.start()
    try:
        sessions = Sessions(db)
        before = _in_database_file(path)
        for _ in range(5):
            await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _wait(lambda: asked)  # the log was written to: it looks for a quiet moment
        time.sleep(0.2)
        assert checkpoints.checkpoints == 0 and _in_database_file(path) == before  # still only in the log
        quiet.set()
        assert _wait(lambda: _in_database_file(path) == before + 5)
        # The file has the rows a moment before the thread counts the checkpoint that put them there.
        assert _wait(lambda: checkpoints.checkpoints >= 1)
        taken = checkpoints.checkpoints
        time.sleep(0.2)
        assert checkpoints.checkpoints == taken  # nothing written since: no checkpoint
        await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _wait(lambda: _in_database_file(path) == before + 6)
    finally:
        checkpoints.close()
        await db.close()


async def test_a_busy_front_end_still_gets_its_checkpoint_after_a_while(tmp_path: Path) -> None:
    path = tmp_path / "ashd.db"
    db = await Database.open(f"sqlite+aiosqlite:///{path}")
    checkpoints = WalCheckpointer(path, lambda: False, interval_s=0.02, at_most_s=0.3)  # never quiet
    checkpoints.start()
    try:
        before = _in_database_file(path)
        started = time.monotonic()
        await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _wait(lambda: _in_database_file(path) == before + 1)
        assert time.monotonic() - started >= 0.25  # not at the first tick: it waited for a quiet moment first
    finally:
        checkpoints.close()
        await db.close()
