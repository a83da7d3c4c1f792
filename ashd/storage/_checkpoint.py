"""SQLite's WAL checkpoints, taken by a thread of their own in quiet moments.

SQLite copies its write-ahead log back into the database file (a checkpoint) on the connection
whose commit takes the log past `wal_autocheckpoint` pages (1,000): that commit, a session's
transition or a turn's last batch, waits for the copy. Measured here: a checkpoint of the log of
1,000 commits (2 KB rows, about 2,000 pages) took 17-24 ms, against 0.03 ms for a commit.

This thread checkpoints before the log gets there: when the log was written to since its last
checkpoint, at a tick (every `INTERVAL_S`) that finds the front end quiet (no request in flight),
or at the first tick `AT_MOST_S` after the write anyway. It looks at its ticks only: no polling for
the quiet moment, which would take the interpreter many times a second from a busy server. A
checkpoint here is PASSIVE: it copies what no reader still needs and never waits for a reader or
blocks a writer, and its work (file I/O, with the interpreter lock released) runs beside the
requests instead of inside one. SQLite's own autocheckpoint stays as it is, for a log that grows
faster than this thread takes it: the log is never larger than before.

A checkpoint that copied the whole log is followed here by a write of one page (the database
header's `user_version`, written back unchanged): the first write after such a checkpoint starts
the log over, and with `synchronous=NORMAL` that write syncs the log's new header to disk, 0.3-1 ms
here and more on network storage. Without it, that sync fell to the next request that writes (a
pause, a message's prompt, most often on the event loop's thread) after every quiet moment.
Measured: docs/performance.md, thirty-sixth pass.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
AT_MOST_S = 2.0  # how long a checkpoint waits for a quiet moment before it is taken anyway


class WalCheckpointer:
    def __init__(self, database: Path, quiet: Callable[[], bool] | None = None, interval_s: float = INTERVAL_S,
                 at_most_s: float = AT_MOST_S) -> None:
        self._database = database
        self._quiet = quiet  # no request in flight now (`Activity.quiet`); None: always
        self._interval = interval_s
        self._at_most = at_most_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # taken so far (tests, and the log's curious reader)
        self.restarts = 0  # logs started over by this thread (`restart_log`)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        # No busy timeout: the log's restart is skipped when a writer holds the lock (its write
        # restarts the log), never waited for. NORMAL, as the server's connections: the checkpoint
        # syncs the log and the database file all the same, and the restart's commit syncs no more
        # than theirs would.
        conn = sqlite3.connect(self._database, isolation_level=None, check_same_thread=False, timeout=0)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            seen: int | None = None
            owed_since: float | None = None  # when a write was first found not checkpointed
            while not self._stop.wait(self._interval):
                written = self._written(conn)
                if written in (seen, None):
                    continue  # nothing was committed since the last checkpoint
                now = time.monotonic()
                owed_since = now if owed_since is None else owed_since
                if self._quiet is not None and not self._quiet() and now - owed_since < self._at_most:
                    continue
                seen, owed_since = written, None  # what this checkpoint takes (a commit after it: the next one)
                if self.checkpoint(conn):
                    self.restart_log(conn)
        finally:
            conn.close()

    @staticmethod
    def _written(conn: sqlite3.Connection) -> int | None:
        """The database's data version as this connection sees it: it changes with each commit of
        another connection, not with this thread's checkpoints and log restarts. None when it
        cannot be read (the next tick reads it again)."""
        try:
            return int(conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None

    def checkpoint(self, conn: sqlite3.Connection) -> bool:
        """A PASSIVE checkpoint; True when it copied the whole log into the database file."""
        try:
            busy, logged, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
        except sqlite3.Error as exc:  # a full disk, say: the next one tries again, and SQLite's own stays
            log.warning("a WAL checkpoint failed: %s", exc)
            return False
        return not busy and logged > 0 and logged == copied

    def restart_log(self, conn: sqlite3.Connection) -> bool:
        """Start the log over now, in this quiet moment, with its header's sync: one page written
        (`user_version`, unchanged). False when a writer holds the lock (its own write restarts the
        log) or the write failed (the next request's write restarts it, as without this)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # locked: a writer is at it
            return False
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("restarting the WAL after a checkpoint failed: %s", exc)
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return False
        self.restarts += 1
        return True
