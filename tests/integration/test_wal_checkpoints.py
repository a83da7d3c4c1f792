"""SQLite's WAL checkpoints taken by their own thread in quiet moments (storage/_checkpoint.py), on a
real database file: what was committed reaches the database file itself, and not before the front
end is quiet."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
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


@contextlib.asynccontextmanager
async def _checkpointed(path: Path, quiet: Callable[[], bool],
                        at_most_s: float) -> AsyncIterator[tuple[Database, WalCheckpointer]]:
    """A database on `path`, with its checkpoint thread started (a tick every 20 ms)."""
    db = await Database.open(f"sqlite+aiosqlite:///{path}")
    checkpoints = WalCheckpointer(path, quiet, interval_s=0.02, at_most_s=at_most_s)
    checkpoints.start()
    try:
        yield db, checkpoints
    finally:
        checkpoints.close()
        await db.close()


async def test_committed_rows_reach_the_database_file_in_a_quiet_moment(tmp_path: Path) -> None:
    path = tmp_path / "ashd.db"
    quiet = threading.Event()
    asked: list[float] = []

    def is_quiet() -> bool:
        asked.append(time.monotonic())
        return quiet.is_set()

    async with _checkpointed(path, is_quiet, at_most_s=60) as (db, checkpoints):
        assert db.sqlite_file == path
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


async def test_a_busy_front_end_still_gets_its_checkpoint_after_a_while(tmp_path: Path) -> None:
    path = tmp_path / "ashd.db"
    async with _checkpointed(path, lambda: False, at_most_s=0.3) as (db, _checkpoints):  # never quiet
        before = _in_database_file(path)
        started = time.monotonic()
        await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _wait(lambda: _in_database_file(path) == before + 1)
        assert time.monotonic() - started >= 0.25  # not at the first tick: it waited for a quiet moment first


def _log_header(path: Path) -> bytes:
    """The write-ahead log's checkpoint sequence and salts: they change when a write starts the log
    over (sqlite.org/fileformat.html, "WAL File Format")."""
    with open(f"{path}-wal", "rb") as wal:
        return wal.read(24)[12:24]


async def test_a_quiet_checkpoint_starts_the_log_over_so_the_next_write_does_not(tmp_path: Path) -> None:
    """The first write after a checkpoint that copied the whole log starts the log over and syncs
    its header (synchronous=NORMAL): the checkpoint's thread does that write itself, so a request's
    write does not; the database header's `user_version` it writes back is unchanged."""
    path = tmp_path / "ashd.db"
    quiet = threading.Event()
    quiet.set()
    async with _checkpointed(path, quiet.is_set, at_most_s=60) as (db, checkpoints):
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA user_version = 7")
        sessions = Sessions(db)
        for _ in range(3):
            await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _wait(lambda: checkpoints.restarts >= 1)
        quiet.clear()  # no checkpoint (nor restart) from here: the next write's own effect is what is seen
        time.sleep(0.1)
        restarted = _log_header(path)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert _log_header(path) == restarted  # appended to the restarted log, not started over again
        assert (await sessions.get("t", row.id)).id == row.id
        taken, restarts = checkpoints.checkpoints, checkpoints.restarts
        quiet.set()
        assert _wait(lambda: checkpoints.checkpoints > taken and checkpoints.restarts > restarts)
        assert _wait(lambda: _in_database_file(path) == 4)
        time.sleep(0.2)
        # The restart's own write is not a commit to checkpoint: no checkpoint after it, ever again.
        assert checkpoints.checkpoints == taken + 1
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == 7


async def test_the_restart_is_skipped_not_waited_for_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "ashd.db"
    db = await Database.open(f"sqlite+aiosqlite:///{path}")
    await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active"))
    checkpoints = WalCheckpointer(path)  # not started: its steps are called here, on a connection like its own
    mine = sqlite3.connect(path, isolation_level=None, timeout=0)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        assert checkpoints.checkpoint(mine)  # the whole log copied: a restart is due
        writer.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert not checkpoints.restart_log(mine)
        assert time.monotonic() - started < 0.5 and checkpoints.restarts == 0
        assert not mine.in_transaction
        writer.execute("ROLLBACK")
        assert checkpoints.restart_log(mine) and checkpoints.restarts == 1
    finally:
        mine.close()
        writer.close()
        await db.close()
