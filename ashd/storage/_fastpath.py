"""Hot-path transactions and reads in one hop.

aiosqlite sends every statement to its own thread and back (about 0.3-0.5 ms a trip here), so a
BEGIN + UPDATE + INSERT + COMMIT costs 1.5-2 ms. For SQLite the whole transaction instead runs as
one synchronous function on a dedicated writer thread with a synchronous engine on the same file
(WAL, BEGIN IMMEDIATE, busy timeout: the same rules as the async engine). SQLite has one writer
at a time anyway, so one thread loses nothing. Reads on a hot path (the agent lookup of every
create) run the same way on reader threads, BEGIN DEFERRED: in WAL they read a snapshot beside
the writer. For PostgreSQL the same function runs through the async engine's `run_sync` (asyncpg
round trips are cheap and the pool gives concurrency).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session as SyncSession

from ashd.storage._direct import SqliteStatements, Statements
from ashd.storage._engine import BUSY_TIMEOUT_MS, READ_ONLY, install_sqlite_pragmas

T = TypeVar("T")


_SQLITE_BUSY = 5


class WriterClosed(RuntimeError):
    """The writer was closed: the server is stopping."""


class WriterBusy(Exception):
    """The database was not free within the time a transaction run inline may wait for it."""


class SqliteWriter:
    def __init__(self, async_url: str) -> None:
        url = make_url(async_url).set(drivername="sqlite")
        self.engine: Engine = create_sync_engine(url, pool_size=1, max_overflow=0)
        install_sqlite_pragmas(self.engine)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        # The writer thread's one connection, kept between transactions: checking a connection out of
        # the pool and back, and an ORM session's own transaction around it, cost more than the
        # statements of a transition (125 -> 77 us a transaction, measured; docs/performance.md).
        self._conn: Connection | None = None
        # Held for each transaction on that connection, by the writer thread or by another thread that
        # runs a short one itself (`direct`): one writer at a time, as SQLite has anyway.
        self._lock = threading.Lock()
        self._closed = False
        # The connection's busy timeout as last set: a transaction run inline waits only INLINE_WAIT_MS
        # for the database, the others BUSY_TIMEOUT_MS. Set only when it changes (each PRAGMA is a
        # statement of its own, and inline transitions mostly follow each other).
        self._busy_ms = BUSY_TIMEOUT_MS

    def _connection(self) -> Connection:
        if self._closed:
            raise WriterClosed("the SQLite writer is closed")
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._conn = self.engine.connect()
            self._busy_ms = BUSY_TIMEOUT_MS  # install_sqlite_pragmas's
        return conn

    def _busy_timeout(self, raw: sqlite3.Connection, ms: int) -> None:
        if self._busy_ms != ms:
            raw.execute(f"PRAGMA busy_timeout={int(ms)}")
            self._busy_ms = ms

    def _run(self, fn: Callable[[SyncSession], T]) -> T:
        with self._lock:
            conn = self._connection()
            raw = conn.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            self._busy_timeout(raw, BUSY_TIMEOUT_MS)
            try:
                return _joined(conn, fn, write=True)
            except BaseException:
                if _unusable(conn):
                    self._drop()  # a commit or rollback that failed: the next transaction gets a new one
                raise

    def direct(self, fn: Callable[[Statements], T], *, wait_ms: int | None = None) -> T:
        """`fn` as one transaction of prebuilt statements on the driver's connection (`_direct.py`),
        on the calling thread. With `wait_ms`, WriterBusy when the database is not this thread's
        within that long (the writer thread, another connection or process holds it): an actor
        running a transition itself does not wait behind a stalled database; it hands the
        transaction to the writer thread instead (`Database.direct_here`)."""
        if not self._lock.acquire(timeout=-1 if wait_ms is None else wait_ms / 1000):
            raise WriterBusy("the SQLite writer is busy")
        try:
            conn = self._connection()
            raw = conn.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            try:
                self._begin_immediate(raw, wait_ms)
                try:
                    result = fn(SqliteStatements(raw))
                except BaseException:
                    if raw.in_transaction:
                        raw.execute("ROLLBACK")
                    raise
                raw.execute("COMMIT")
                return result
            except WriterBusy:
                raise
            except BaseException:
                if _unusable(conn):
                    self._drop()
                raise
        finally:
            self._lock.release()

    def _begin_immediate(self, raw: sqlite3.Connection, wait_ms: int | None) -> None:
        self._busy_timeout(raw, BUSY_TIMEOUT_MS if wait_ms is None else wait_ms)
        try:
            raw.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if wait_ms is not None and exc.sqlite_errorcode & 0xFF == _SQLITE_BUSY:
                raise WriterBusy("the database is locked by another writer") from exc
            raise

    def submit_direct(self, fn: Callable[[Statements], T], wrap: Callable[[Callable[[], T]], T]) -> Future[T]:
        """`direct` on the writer thread, from any thread, waiting as long as it takes; `wrap(run)`
        runs it (it maps the errors the way `Database.run_direct` does)."""
        return self._thread.submit(wrap, lambda: self.direct(fn))

    async def run_direct(self, fn: Callable[[Statements], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.direct, fn)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()

    async def run(self, fn: Callable[[SyncSession], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, fn)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already shut down
            self._thread.submit(self._close_conn).result()  # on its own thread, as it was used
        self._thread.shutdown(wait=True)
        self.engine.dispose()

    def _close_conn(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()


def _joined(conn: Connection, fn: Callable[[SyncSession], T], *, write: bool) -> T:
    """`fn` in an ORM session that joins one transaction of the kept connection (BEGIN IMMEDIATE for
    the writer, DEFERRED for a reader: `install_sqlite_pragmas`): the session flushes into it and
    never ends it. The writer's is committed unless `fn` raises; a read is rolled back (it wrote
    nothing: its snapshot is let go)."""
    with conn.begin() as transaction:
        s = SyncSession(bind=conn, expire_on_commit=False)
        try:
            result = fn(s)
            if write:
                s.flush()
        finally:
            s.close()
        if not write:
            transaction.rollback()
    return result


def _unusable(conn: Connection) -> bool:
    """A connection a failed commit or rollback left in a transaction (or invalid) is not kept."""
    if conn.invalidated or conn.in_transaction():
        return True
    try:
        return bool(conn.connection.driver_connection.in_transaction)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a connection that cannot even say is not kept
        return True


class SqliteReader:
    """Read-only functions in one hop each, on `threads` threads with their own connections."""

    def __init__(self, async_url: str, threads: int = 2) -> None:
        url = make_url(async_url).set(drivername="sqlite")
        self.engine: Engine = create_sync_engine(url, pool_size=threads, max_overflow=0)
        install_sqlite_pragmas(self.engine)
        self._read_only = self.engine.execution_options(**{READ_ONLY: True})  # BEGIN DEFERRED
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sqlite-reader")
        # Each reader thread keeps its connection between reads, as the writer does.
        self._local = threading.local()
        self._held: list[Connection] = []
        self._lock = threading.Lock()

    def _run(self, fn: Callable[[SyncSession], T]) -> T:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = self._local.conn = self._read_only.connect()
            with self._lock:
                self._held.append(conn)
        try:
            return _joined(conn, fn, write=False)
        except BaseException:
            if _unusable(conn):
                self._local.conn = None
                with contextlib.suppress(Exception):
                    conn.invalidate()
            raise

    async def run(self, fn: Callable[[SyncSession], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._run, fn)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        with self._lock:
            held, self._held = self._held, []
        for conn in held:  # pysqlite connections of a file database may be closed from any thread
            with contextlib.suppress(Exception):
                conn.close()
        self.engine.dispose()
