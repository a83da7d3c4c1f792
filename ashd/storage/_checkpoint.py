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
"""

from __future__ import annotations

import logging
import os
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
        self._wal = Path(f"{database}-wal")
        self._quiet = quiet  # no request in flight now (`Activity.quiet`); None: always
        self._interval = interval_s
        self._at_most = at_most_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # taken so far (tests, and the log's curious reader)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        conn = sqlite3.connect(self._database, isolation_level=None, check_same_thread=False)
        try:
            seen: tuple[int, int] | None = None
            owed_since: float | None = None  # when a write was first found not checkpointed
            while not self._stop.wait(self._interval):
                written = self._written()
                if written in (seen, None):
                    continue  # nothing was committed since the last checkpoint
                now = time.monotonic()
                owed_since = now if owed_since is None else owed_since
                if self._quiet is not None and not self._quiet() and now - owed_since < self._at_most:
                    continue
                seen, owed_since = written, None  # what this checkpoint takes (a commit after it: the next one)
                self.checkpoint(conn)
        finally:
            conn.close()

    def _written(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._wal)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as exc:  # a full disk, say: the next one tries again, and SQLite's own stays
            log.warning("a WAL checkpoint failed: %s", exc)
