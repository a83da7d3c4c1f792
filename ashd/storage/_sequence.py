"""Atomic per-session sequence allocation (`UPDATE … RETURNING`), safe across processes."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import update
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


def allocate_sync(db: SyncSession, session_id: str, kind: Literal["message", "event", "log"], count: int = 1) -> int:
    """`allocate` for transactions run with `Database.run_tx`."""
    column = {"message": Session.next_message_seq, "event": Session.next_event_seq,
              "log": Session.next_log_seq}[kind]
    last = db.execute(
        update(Session).where(Session.id == session_id).values({column: column + count}).returning(column)
    ).scalar_one_or_none()
    if last is None:
        raise NotFound(f"Session {session_id} not found")
    return int(last) - count + 1
