"""Transactions of prebuilt statements on PostgreSQL, on asyncpg's connection (`_direct.PgStatements`).

Through an ORM session a transaction of two statements took 1.8 ms on the server (a pause's), about
as much Python around the driver as the round trips themselves: the session, its connection and
transaction objects, a compile-cache lookup and parameter processing per statement, and the
pool's ping before each (docs/performance.md, thirty-first pass). Here a connection is taken from
the same SQLAlchemy pool (its limits, its idle ping, its invalidation after a disconnect), the
transaction is asyncpg's own (BEGIN, the statements, COMMIT), and the transaction function runs in
one greenlet of SQLAlchemy's, as `AsyncSession.run_sync` runs it.

A connection that fails, or whose work is interrupted (a cancelled request), is invalidated rather
than handed back in an unknown state. A transaction whose BEGIN fails on a dead connection has
changed nothing, nor has a read, nor a write asyncpg refused before sending it: each is tried once
more on another connection (after a database restart, the pool's connections all fail that way
once). A write cut off after it was sent is not: whether it ran is unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import Engine
from sqlalchemy.util import await_only, greenlet_spawn

from ashd.storage._direct import PgStatements, Statements
from ashd.storage._failures import is_disconnect

T = TypeVar("T")
log = logging.getLogger(__name__)


class _NotStarted(Exception):
    """The connection turned out to be dead before anything could have been changed: a transaction's
    BEGIN failed, a read did, or the connection was known closed before a write was sent."""


def _dead(exc: Exception) -> bool:
    """A connection the server dropped shows as a disconnect, or, when the drop arrived while it was
    idle, as a client-side error of asyncpg's (its protocol in a state it cannot leave). An error
    the server reported for a statement, or one of ours (a refused transition), leaves it usable."""
    return is_disconnect(exc) or isinstance(exc, (asyncpg.InterfaceError, asyncpg.InternalClientError))


def _refused_unsent(exc: Exception, raw: Any) -> bool:
    """Whether asyncpg refused the statement before sending it: its protocol in a state it cannot
    leave (the server's goodbye arrived while the connection sat in the pool), or the connection
    known closed. A statement sent and then cut off raises ConnectionDoesNotExistError instead:
    whether it ran is unknown, so it is not tried again."""
    return isinstance(exc, asyncpg.InternalClientError) or (
        isinstance(exc, asyncpg.InterfaceError) and raw.is_closed())


class PgDirect:
    """`run` modes: TRANSACTION (BEGIN, the function's statements, COMMIT); READ (its statements
    each on their own, no BEGIN or COMMIT: for reads only); ONE_WRITE (the function writes with one
    statement, which PostgreSQL runs atomically on its own: no BEGIN or COMMIT, two round trips
    fewer; any statements after it only read, to say why it changed nothing)."""

    TRANSACTION, READ, ONE_WRITE = "transaction", "read", "one write"

    def __init__(self, sync_engine: Engine) -> None:
        self._engine = sync_engine

    async def run(self, fn: Callable[[Statements], T], mode: str = TRANSACTION) -> T:
        """`fn(statements)` in `mode`; tried once more on another connection when this one was found
        dead before anything could have changed (never after a write was sent: its outcome is unknown)."""
        try:
            return await greenlet_spawn(self._once, fn, mode)
        except _NotStarted as first:
            log.info("a pooled database connection was dead; trying once more on another",
                     extra={"error": str(first.__cause__)})
            try:
                return await greenlet_spawn(self._once, fn, mode)
            except _NotStarted as second:
                raise second.__cause__ or second from None

    def _once(self, fn: Callable[[Statements], T], mode: str) -> T:
        fairy = self._engine.raw_connection()  # the pool's checkout: its idle ping runs here
        raw: Any = fairy.driver_connection
        open_tx = False  # a transaction begun and neither committed nor rolled back
        rolled_back = False  # the transaction function failed, and its transaction ended cleanly
        try:
            if mode == self.READ:
                try:
                    return fn(PgStatements(raw))
                except Exception as exc:
                    if _dead(exc):
                        raise _NotStarted() from exc
                    raise
            if mode == self.ONE_WRITE:
                try:
                    return fn(PgStatements(raw, combines_writes=True))
                except Exception as exc:
                    if _refused_unsent(exc, raw):
                        raise _NotStarted() from exc
                    raise
            try:
                tx = raw.transaction()  # refused at once by a connection asyncpg knows is closed
                await_only(tx.start())
            except Exception as exc:
                if _dead(exc):
                    raise _NotStarted() from exc
                raise
            open_tx = True
            try:
                result = fn(PgStatements(raw))
            except Exception:
                await_only(tx.rollback())
                open_tx, rolled_back = False, True
                raise
            await_only(tx.commit())
            open_tx = False
            return result
        except _NotStarted as exc:
            # The whole pool, as SQLAlchemy's own connections do on a disconnect: the others were made
            # as long ago and are as likely dead; each is made again at its next checkout.
            self._engine.pool._invalidate(fairy, exc.__cause__)
            raise
        except Exception as exc:
            # Rolled back, or an error the server reported for a statement: the connection is as it was.
            if not rolled_back and (open_tx or _dead(exc)):
                if _dead(exc):
                    self._engine.pool._invalidate(fairy, exc)
                else:
                    fairy.invalidate(exc)
            raise
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            fairy.invalidate()
            raise
        finally:
            fairy.close()
