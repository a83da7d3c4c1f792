"""Usage events: one row per measured quantity per turn, and their sums (UsageStats).

Lists are ascending by `createdAt` (then id), like every other list of the API; `after` and
`before` are exclusive time bounds. All rows of one `record_usage` call share one timestamp: they
describe one turn.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Insert, Table, func, insert, select

from ashd.errors import BadRequest
from ashd.storage._database import Database
from ashd.storage._direct import Statements
from ashd.storage._models import UsageEvent, iso, new_id, utcnow

# Event type → UsageStats field (the interface's seven fields).
STAT_FIELDS: dict[str, str] = {
    "input_tokens": "totalInputTokens",
    "output_tokens": "totalOutputTokens",
    "cache_creation_tokens": "totalCacheCreationTokens",
    "cache_read_tokens": "totalCacheReadTokens",
    "tool_calls": "totalToolCalls",
    "message": "totalMessages",
    "compute_seconds": "totalComputeSeconds",
}
EVENT_TYPES = tuple(STAT_FIELDS)


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True)
class UsageFilter:
    session_id: str | None = None
    agent_name: str | None = None
    after: dt.datetime | None = None
    before: dt.datetime | None = None


def parse_time(raw: str | None, name: str) -> dt.datetime | None:
    """An ISO 8601 query bound (a zone-less value is UTC), or BadRequest naming the parameter."""
    if raw is None or raw == "":
        return None
    try:
        value = dt.datetime.fromisoformat(raw.strip().replace(" ", "+"))
    except ValueError as exc:
        raise BadRequest(f"query `{name}` must be an ISO 8601 date-time, e.g. 2025-01-31T12:00:00Z") from exc
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _conditions(tenant: str, flt: UsageFilter) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = [UsageEvent.tenant_id == tenant]
    if flt.session_id is not None:
        conds.append(UsageEvent.session_id == flt.session_id)
    if flt.agent_name is not None:
        conds.append(UsageEvent.agent_name == flt.agent_name)
    if flt.after is not None:
        conds.append(UsageEvent.created_at > flt.after)
    if flt.before is not None:
        conds.append(UsageEvent.created_at < flt.before)
    return conds


INSERT_USAGE: Insert = insert(cast(Table, UsageEvent.__table__))


@dataclass(frozen=True)
class TurnUsage:
    """What one turn used (`values` by event type), stored with the turn's last frames."""

    agent_name: str
    values: Mapping[str, float]


def usage_rows(tenant: str, session_id: str, usage: TurnUsage, now: dt.datetime) -> list[dict[str, Any]]:
    """One row per non-zero value, all at `now`. Non-finite or negative values are a programming error."""
    rows = []
    for event_type, value in usage.values.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"usage value {event_type}={value!r} must be finite and not negative")
        if value:
            rows.append({"id": new_id(), "tenant_id": tenant, "session_id": session_id,
                         "agent_name": usage.agent_name, "event_type": event_type, "value": float(value),
                         "created_at": now})
    return rows


async def record_usage(db: Database, tenant: str, session_id: str, agent_name: str,
                       values: Mapping[str, float]) -> int:
    """Store one usage row per non-zero value (one transaction); returns the rows written. (A turn's
    usage goes with its last frames instead: `Sessions.store_turn_batch`.)"""
    rows = usage_rows(tenant, session_id, TurnUsage(agent_name, values), utcnow())

    def run(x: Statements) -> None:
        for row in rows:
            x.run(INSERT_USAGE, row)

    if rows:
        await db.run_direct(run)
    return len(rows)


async def list_usage(db: Database, tenant: str, flt: UsageFilter, limit: int) -> list[dict[str, Any]]:
    query = select(UsageEvent).where(*_conditions(tenant, flt)).order_by(UsageEvent.created_at, UsageEvent.id)
    rows = await db.run_read(lambda s: s.execute(query.limit(limit)).scalars().all())  # one hop
    return [
        {"id": r.id, "tenantId": r.tenant_id, "sessionId": r.session_id, "agentName": r.agent_name,
         "eventType": r.event_type, "value": _number(r.value), "createdAt": iso(r.created_at)}
        for r in rows
    ]


async def usage_stats(db: Database, tenant: str, flt: UsageFilter) -> dict[str, float | int]:
    """The seven UsageStats sums (0 where nothing was recorded)."""
    query = (select(UsageEvent.event_type, func.sum(UsageEvent.value))
             .where(*_conditions(tenant, flt), UsageEvent.event_type.in_(EVENT_TYPES))
             .group_by(UsageEvent.event_type))
    sums = await db.run_read(lambda s: s.execute(query).all())
    stats: dict[str, float | int] = dict.fromkeys(STAT_FIELDS.values(), 0)
    for event_type, total in sums:
        stats[STAT_FIELDS[event_type]] = _number(float(total or 0))
    return stats
