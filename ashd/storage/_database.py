"""The Database handle: engine, session factory and server-wide meta values."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import AsyncSession as OrmSession
from sqlalchemy.orm import Session as SyncSession
from sqlalchemy.sql import ClauseElement

from ashd.errors import Unavailable
from ashd.storage._direct import CoreStatements, Row, Statements
from ashd.storage._engine import READ_ONLY, create_engine, normalise_url, sessionmaker
from ashd.storage._failures import storage_failure
from ashd.storage._fastpath import SqliteReader, SqliteWriter, WriterBusy, WriterClosed
from ashd.storage._fastpath_pg import PgDirect
from ashd.storage._migrate import migrate
from ashd.storage._models import Meta

T = TypeVar("T")
# How long a transaction run on an actor's own thread waits for the database before it goes to the
# writer thread instead: longer than the writer's usual transaction, far shorter than a stall.
INLINE_WAIT_MS = 20
# On the event loop's thread (an actor's request handled there, `actors/_inline.py`) it does not
# wait at all: every other request waits while the loop does.
LOOP_WAIT_MS = 0


class Database:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine)
        # On PostgreSQL a read runs without BEGIN and ROLLBACK around it, two round trips of its three:
        # at READ COMMITTED (the default, never changed here) each statement takes its own snapshot
        # inside a transaction too, so a read sees nothing different.
        readers = {"isolation_level": "AUTOCOMMIT"} if engine.dialect.name == "postgresql" else {}
        self._readers = sessionmaker(engine.execution_options(**{READ_ONLY: True}, **readers))
        self._writer: SqliteWriter | None = None
        self._reader: SqliteReader | None = None
        self._pg = PgDirect(engine.sync_engine) if engine.dialect.name == "postgresql" else None
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            self._writer = SqliteWriter(engine.url.render_as_string(hide_password=False))
            self._reader = SqliteReader(engine.url.render_as_string(hide_password=False))

    async def run_tx(self, fn: Callable[[SyncSession], T]) -> T:
        """Run `fn(session)` as one transaction (committed unless it raises), in one hop on SQLite."""
        try:
            if self._writer is not None:
                return await self._writer.run(fn)
            async with self._sessions() as s, s.begin():
                return await s.run_sync(fn)
        except Exception as exc:
            _raise_mapped(exc)
            raise

    async def run_read(self, fn: Callable[[SyncSession], T]) -> T:
        """Run `fn(session)` in a read-only transaction (it must not write: see `read`), in one hop
        on SQLite. `fn` may also make a quick check of a file that goes with the read."""
        try:
            if self._reader is not None:
                return await self._reader.run(fn)
            async with self._readers() as s:
                return await s.run_sync(fn)
        except Exception as exc:
            _raise_mapped(exc)
            raise

    async def read_rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        """The rows of one prebuilt SELECT (`_direct.py`), as dicts by column key: on PostgreSQL one
        statement on the driver, outside a transaction (at READ COMMITTED it would see the same)."""
        try:
            if self._pg is not None:
                return await self._pg.run(lambda x: x.rows(statement, params), PgDirect.READ)
        except Exception as exc:
            _raise_mapped(exc)
            raise
        return await self.run_read(
            lambda s: [dict(m) for m in s.execute(statement, dict(params)).mappings()])  # type: ignore[call-overload]

    async def run_direct(self, fn: Callable[[Statements], T], *, one_write: bool = False) -> T:
        """`fn(statements)` as one transaction of prebuilt statements (`_direct.py`): on the SQLite
        writer thread, on asyncpg's connection (PostgreSQL, `_fastpath_pg.py`), or through the
        async engine (an in-memory database). `one_write`: where `Statements.combines_writes`, `fn`
        writes with one statement, run on its own without a transaction around it."""
        try:
            if self._writer is not None:
                return await self._writer.run_direct(fn)
            if self._pg is not None:
                return await self._pg.run(fn, PgDirect.ONE_WRITE if one_write else PgDirect.TRANSACTION)
            async with self._sessions() as s, s.begin():
                return await s.run_sync(lambda sync: fn(CoreStatements(sync.connection())))
        except Exception as exc:
            _raise_mapped(exc)
            raise

    def direct_here(self, fn: Callable[[Statements], T], before: Callable[[], None] | None = None,
                    ) -> Future[T] | None:
        """`fn(statements)` as one transaction, on SQLite: run now on the calling thread (an actor's)
        when the database is free within `INLINE_WAIT_MS` (on the loop's thread: free at once), a
        future already resolved; else handed to the writer thread (a future it resolves), so that a
        stalled database holds up no actor. None where there is no writer (await `run_direct`).
        `before()` runs inside the transaction before `fn` when it runs here, not on the writer's."""
        writer = self._writer
        if writer is None:
            return None
        wait_ms = LOOP_WAIT_MS if _on_loop() else INLINE_WAIT_MS
        here = fn if before is None else _after(before, fn)
        done: Future[T] = Future()
        try:
            done.set_result(_mapped_call(lambda: writer.direct(here, wait_ms=wait_ms)))
        except WriterBusy:
            try:
                return writer.submit_direct(fn, _mapped_call)
            except RuntimeError as exc:  # the writer thread is shut down: the server is stopping
                raise Unavailable("the service is shutting down; try again") from exc
        except WriterClosed:  # the server is stopping
            done.set_exception(Unavailable("the service is shutting down; try again"))
        except Exception as exc:  # noqa: BLE001 - the future carries the error to its reader
            done.set_exception(exc)
        return done

    @classmethod
    async def open(cls, url: str) -> Database:
        db = cls(create_engine(url))
        await migrate(db.engine)
        return db

    @property
    def sqlite_file(self) -> Path | None:
        """The database file on SQLite (not in memory), else None."""
        return Path(self.engine.url.database) if self._writer is not None and self.engine.url.database else None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @staticmethod
    def describe(url: str) -> str:
        """The URL without its password, for logs and /health."""
        from sqlalchemy.engine import make_url

        return make_url(normalise_url(url)).render_as_string(hide_password=True)

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[OrmSession]:
        """One transaction: committed on success, rolled back on any error."""
        try:
            async with self._sessions() as s, s.begin():
                yield s
        except Exception as exc:
            _raise_mapped(exc)
            raise

    @asynccontextmanager
    async def read(self) -> AsyncIterator[OrmSession]:
        """A session that only reads: on SQLite it takes no write lock (BEGIN DEFERRED), so it must not
        write (a write there could fail with SQLITE_BUSY_SNAPSHOT); use `tx` for anything that does."""
        try:
            async with self._readers() as s:
                yield s
        except Exception as exc:
            _raise_mapped(exc)
            raise

    async def meta(self, name: str) -> str | None:
        async with self.read() as s:
            return (await s.execute(select(Meta.value).where(Meta.name == name))).scalar_one_or_none()

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.close)
        await self.engine.dispose()


def _mapped_call(run: Callable[[], T]) -> T:
    try:
        return run()
    except Exception as exc:
        _raise_mapped(exc)
        raise


def _raise_mapped(exc: Exception) -> None:
    """A full disk becomes StorageFull (507), an unreachable database DatabaseUnavailable (503);
    anything else (constraint violations the callers handle, bugs) goes on as it was."""
    mapped = storage_failure(exc, database=True)
    if mapped is not None and mapped is not exc:
        raise mapped from exc


def _after(before: Callable[[], None], fn: Callable[[Statements], T]) -> Callable[[Statements], T]:
    def run(x: Statements) -> T:
        before()
        return fn(x)

    return run


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
