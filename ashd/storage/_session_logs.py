"""A session's log lines: its agent's setup output and its sandbox's stderr (`GET .../logs`).

Each line gets the session's next log index (`sessions.next_log_seq`, from 0) in the transaction
that stores it. Setup lines are also stored as `lifecycle` events `{action: "setup", ...}`, so the
events listing tells what setup printed in order with the rest of the session's life (a new event
type would break clients that check the interface's type enum). A session keeps at most
`max_lines` lines: older ones are deleted as newer ones come (the tail is what helps). The events
count in what the session holds (`stored_bytes`) like every event; the log lines are bounded by
`max_lines` instead, so that what a tenant holds does not move with every sweep of a sandbox's stderr.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session as SyncSession

from ashd.storage._database import Database
from ashd.storage._models import Session, SessionEvent, SessionLog, iso, new_id, utcnow
from ashd.storage._sequence import allocate_sync

LEVELS = ("stdout", "stderr", "system")
_LOGS = cast(Table, SessionLog.__table__)
_LINES_AFTER = (select(SessionLog.idx, SessionLog.level, SessionLog.created_at, SessionLog.text, SessionLog.source)
                .where(SessionLog.session_id == bindparam("id"), SessionLog.tenant_id == bindparam("tenant"),
                       SessionLog.idx > bindparam("after"))
                .order_by(SessionLog.idx).limit(bindparam("limit", type_=Integer)))
_COUNT = select(func.count()).select_from(SessionLog).where(SessionLog.session_id == bindparam("id"))


@dataclass(frozen=True)
class LogLine:
    level: str  # stdout, stderr or system
    text: str
    step: str | None = None  # setup lines: `npm install`, `setup.sh`
    ts: dt.datetime = field(default_factory=utcnow)


def _size(text: str) -> int:
    return len(text.encode())


class SessionLogs:
    def __init__(self, db: Database, max_lines: int = 10_000) -> None:
        self.db = db
        self.max_lines = max(1, max_lines)

    async def add(self, session_id: str, tenant: str, lines: Sequence[LogLine], *, source: str) -> None:
        """Store lines in order; `source="setup"` also stores each as a lifecycle event."""
        if not lines:
            return
        setup = source == "setup"

        def run(s: SyncSession) -> None:
            first = allocate_sync(s, session_id, "log", len(lines)) - 1  # indexes count from 0
            rows = [{"session_id": session_id, "tenant_id": tenant, "idx": first + i, "level": line.level,
                     "source": source, "text": line.text, "created_at": line.ts} for i, line in enumerate(lines)]
            s.execute(insert(_LOGS), rows)
            size = events = 0
            if setup:
                seq = allocate_sync(s, session_id, "event", len(lines))
                datas = [json.dumps({"action": "setup", "step": line.step, "level": line.level, "text": line.text,
                                     "index": first + i}) for i, line in enumerate(lines)]
                s.execute(insert(SessionEvent), [
                    {"id": new_id(), "session_id": session_id, "tenant_id": tenant, "type": "lifecycle",
                     "data": data, "sequence": seq + i, "created_at": line.ts}
                    for i, (line, data) in enumerate(zip(lines, datas, strict=True))])
                size += sum(_size(d) for d in datas)
                events = len(lines)
            self._trim(s, session_id, first + len(lines) - 1)
            if events:
                s.execute(update(Session).where(Session.id == session_id).values(
                    event_count=Session.event_count + events, stored_bytes=Session.stored_bytes + size))

        await self.db.run_tx(run)

    def _trim(self, s: SyncSession, session_id: str, last: int) -> None:
        """Delete the lines older than the newest `max_lines`."""
        below = last - self.max_lines + 1
        if below > 0:
            s.execute(delete(SessionLog).where(SessionLog.session_id == session_id, SessionLog.idx < below))

    async def list(self, tenant: str, session_id: str, after: int, limit: int) -> builtins.list[dict[str, Any]]:
        values = {"id": session_id, "tenant": tenant, "after": after, "limit": limit}
        rows = await self.db.run_read(lambda s: s.execute(_LINES_AFTER, values).all())  # one hop
        return [{"index": r.idx, "level": r.level, "ts": iso(r.created_at), "text": r.text, "source": r.source}
                for r in rows]

    async def count(self, session_id: str) -> int:
        return int(await self.db.run_read(lambda s: s.execute(_COUNT, {"id": session_id}).scalar_one()))
