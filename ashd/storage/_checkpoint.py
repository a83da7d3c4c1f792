"""SQLite's WAL checkpoints, taken by a thread of their own in quiet moments.

SQLite copies its write-ahead log back into the database file (a checkpoint) on the connection
whose commit takes the log past `wal_autocheckpoint` pages (1,000): that commit, a session's
transition or a turn's last batch, waits for the copy. Measured in process here: 4,000
transitions, p50 0.27 ms, and 31 of them over 2 ms (at most 8.9 ms), the ones that checkpointed.

This thread checkpoints before the log gets there: every `INTERVAL_S` when the log was written to
since its last checkpoint, in a quiet moment of the front end (no request in flight), or after
`AT_MOST_S` anyway. A checkpoint here is PASSIVE: it copies what no reader still needs and never
waits for a reader or blocks a writer, and its work (file I/O, with the interpreter lock released)
runs beside the requests instead of inside one. SQLite's own autocheckpoint stays as it is, for
a log that grows faster than this thread takes it: the log is never larger than before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
AT_MOST_S = 1.0  # how long a checkpoint waits for a quiet moment before it is taken anyway

# (stop) -> True once the front end is quiet; returns early (False) when `stop` is set.
WaitQuiet = Callable[[threading.Event], bool]


class WalCheckpointer:
    def __init__(self, database: Path, wait_quiet: WaitQuiet | None = None, interval_s: float = INTERVAL_S) -> None:
        self._database = database
        self._wal = Path(f"{database}-wal")
        self._wait_quiet = wait_quiet
        self._interval = interval_s
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
            while not self._stop.wait(self._interval):
                if self._written() in (seen, None):
                    continue  # nothing was committed since the last checkpoint
                if self._wait_quiet is not None:
                    self._wait_quiet(self._stop)
                if self._stop.is_set():
                    return
                seen = self._written()  # what this checkpoint takes (a commit after it: the next one)
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
