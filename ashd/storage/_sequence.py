"""Atomic per-session sequence allocation (`UPDATE … RETURNING`), safe across processes."""

from __future__ import annotations

from typing import Literal, cast

from sqlalchemy import Table, Update, bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession as OrmSession
from sqlalchemy.orm import Session as SyncSession

from ashd.errors import NotFound
from ashd.storage._models import Session


async def allocate(db: OrmSession, session_id: str, kind: Literal["message", "event"], count: int = 1) -> int:
    """Reserve `count` consecutive numbers; returns the first. Call inside the inserting transaction."""
    column = Session.next_message_seq if kind == "message" else Session.next_event_seq
    result = await db.execute(
        update(Session).where(Session.id == session_id).values({column: column + count}).returning(column)
    )
    last = result.scalar_one_or_none()
    if last is None:
        raise NotFound(f"Session {session_id} not found")
    return int(last) - count + 1


_SESSIONS = cast(Table, Session.__table__)
_COLUMNS = {"message": _SESSIONS.c.next_message_seq, "event": _SESSIONS.c.next_event_seq,
            "log": _SESSIONS.c.next_log_seq}
# Built once, with bind parameters: on the path of every turn and every stored log line, where
# building the ORM statement (and its cache key) each time cost more than the SQL.
_ALLOCATE: dict[str, Update] = {
    kind: update(_SESSIONS).where(_SESSIONS.c.id == bindparam("_id"))
    .values({column: column + bindparam("_count")}).returning(column)
    for kind, column in _COLUMNS.items()}


def allocate_sync(db: SyncSession, session_id: str, kind: Literal["message", "event", "log"], count: int = 1) -> int:
    """`allocate` for transactions run with `Database.run_tx`."""
    last = db.connection().execute(_ALLOCATE[kind], {"_id": session_id, "_count": count}).scalar_one_or_none()
    if last is None:
        raise NotFound(f"Session {session_id} not found")
    return int(last) - count + 1
