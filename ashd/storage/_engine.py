"""Builds the async engine: SQLite (WAL, BEGIN IMMEDIATE, busy timeout) or PostgreSQL (asyncpg).

SQLite recipe from notes/measured.md Q3: a deferred BEGIN that later writes fails with
SQLITE_BUSY_SNAPSHOT under concurrency, so every transaction that may write begins IMMEDIATE;
busy_timeout makes writers wait for the lock instead of failing. A read-only session (`READ_ONLY`
on its connection) begins DEFERRED: in WAL it reads a snapshot and never takes the write lock, so
it neither waits for a writer nor makes one wait (an IMMEDIATE read holds the lock, and SQLite's
busy handler then sleeps the writer in whole milliseconds: measured in docs/performance.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.ext.asyncio import AsyncSession as OrmSession
from sqlalchemy.util import await_only

# Execution option of the connections a read-only session uses (`Database.read`): BEGIN DEFERRED.
READ_ONLY = "ashd_read_only"
BUSY_TIMEOUT_MS = 10_000
# A pooled PostgreSQL connection idle in the pool this long is pinged before use (`install_idle_ping`).
PING_AFTER_IDLE_S = 1.0
_IDLE_SINCE = "ashd_idle_since"


def normalise_url(url: str) -> str:
    """Accept the URL forms operators write (`postgres://`, `postgresql://`, `sqlite:///`)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+asyncpg://" + url[len("postgresql://"):]
    if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
        url = "sqlite+aiosqlite://" + url[len("sqlite://"):]
    return url


def create_engine(url: str) -> AsyncEngine:
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, pool_size=4, max_overflow=4, pool_pre_ping=False)
        install_sqlite_pragmas(engine.sync_engine)
        return engine
    engine = create_async_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=False)
    install_idle_ping(engine.sync_engine)
    return engine


def install_idle_ping(sync_engine: Engine) -> None:
    """Check a pooled PostgreSQL connection before use only when it has sat idle in the pool for
    `PING_AFTER_IDLE_S`: one `;` round trip, and a dead one is replaced (the pool tries again).

    SQLAlchemy's `pool_pre_ping` pings on every checkout, in a transaction of its own: BEGIN, `;`,
    ROLLBACK, three round trips before each of a request's transactions (a pause on PostgreSQL made
    two: docs/performance.md, thirty-first pass). A connection used a moment ago is alive unless
    the server went away within that moment; then the statement fails as it would have failed a
    moment earlier, the pool is invalidated (SQLAlchemy does that on any disconnect), and the
    direct path's work that failed before anything was sent is tried once again (`_fastpath_pg.py`)."""

    @event.listens_for(sync_engine, "checkin")
    def on_checkin(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def on_checkout(_dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # new, or used a moment ago
        try:
            await_only(record.driver_connection.execute(";"))  # the simple protocol: one round trip
        except Exception as exc:  # any failure means: not this connection
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def install_sqlite_pragmas(sync_engine: Engine) -> None:
    """WAL, NORMAL sync, busy timeout, foreign keys, and BEGIN IMMEDIATE for every transaction but
    a read-only one's."""

    @event.listens_for(sync_engine, "connect")
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's `begin` event issue BEGIN itself (pysqlite transaction recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(sync_engine, "begin")
    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[OrmSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
