"""Which low-level failures mean "no room to store" (507) or "database unreachable" (503).

SQLite says SQLITE_FULL ("database or disk is full") when its file or WAL cannot grow; PostgreSQL
raises SQLSTATE 53100 (disk_full); file writes raise OSError ENOSPC, or EDQUOT where the data dir
has a filesystem quota. A database that cannot be reached shows up as a connection error (asyncpg
raises the socket's own ConnectionRefusedError, unwrapped), SQLSTATE class 08, or a server
shutting down (57P01-57P03). Everything else is left alone: it is a bug, not an outage.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from typing import Any

from ashd.errors import DatabaseUnavailable, StorageError, StorageFull

FULL_MESSAGE = ("The server's data disk is full, so this change could not be stored. Nothing already "
                "stored was lost and reads keep working; retry once the operator has freed space")
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_PG_DISK_FULL = "53100"
_PG_UNAVAILABLE = ("57P01", "57P02", "57P03")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, the driver error SQLAlchemy wraps (`orig`), and their causes."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 16:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for nxt in (getattr(e, "orig", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def is_no_space(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return True
        code = getattr(e, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
            return True
        if getattr(e, "sqlstate", None) == _PG_DISK_FULL or getattr(e, "pgcode", None) == _PG_DISK_FULL:
            return True
        if "database or disk is full" in str(e):
            return True
    return False


def _unreachable(exc: BaseException) -> str | None:
    for e in _chain(exc):
        state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(state, str) and (state.startswith("08") or state in _PG_UNAVAILABLE):
            return str(e).splitlines()[0] if str(e) else state
        code = getattr(e, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_CANTOPEN:
            return "the database file cannot be opened"
        if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__name__ in (
                "ConnectionDoesNotExistError", "InterfaceError", "CannotConnectNowError"):
            return str(e) or type(e).__name__
    return None


def is_disconnect(exc: BaseException) -> bool:
    """Whether `exc` says the database connection is gone or the database unreachable."""
    return _unreachable(exc) is not None


def storage_failure(exc: BaseException, *, database: bool = False) -> StorageError | None:
    """The ApiError-ready error for `exc` when it is a full disk (507), or, for failures raised by
    the database (`database=True`), an unreachable database (503); None otherwise."""
    if isinstance(exc, StorageError):
        return exc if isinstance(exc, (StorageFull, DatabaseUnavailable)) else None
    if is_no_space(exc):
        return StorageFull(FULL_MESSAGE)
    if database:
        reason = _unreachable(exc)
        if reason is not None:
            return DatabaseUnavailable(f"The database is unreachable ({reason[:200]}); retry shortly")
    return None


def log_failure(logger: logging.Logger, message: str, exc: BaseException, **extra: Any) -> None:
    """A full disk is an expected outage with an operator's fix: one WARNING line, no traceback.
    Anything else is logged with its traceback, as a failure to look into."""
    if is_no_space(exc):
        logger.warning("%s: the data disk is full (%s)", message, exc, extra=extra)
    else:
        logger.exception(message, extra=extra)
