"""Model calls recorded by the proxy: stored with their usage events, listed for the audit, summed
for budgets.

A batch is one transaction: each session's calls get consecutive sequence numbers from the
session row's counter (`UPDATE … RETURNING`, sessions locked in id order so two writers never wait
on each other in a cycle), the call rows are inserted, and so are the usage events the tokens make
(`input_tokens`, `output_tokens`, `cache_creation_tokens`, `cache_read_tokens`, `cost_usd`), so
`GET /api/usage` and `/api/usage/stats` show exactly what the proxy saw.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update

from ashd.storage._database import Database
from ashd.storage._direct import Statements
from ashd.storage._models import ModelCall, Session, UsageEvent, iso, new_id


# What the model proxy records of one call: the row this module stores (defined here, where it is
# stored, so storage depends on nothing of sandboxing).
@dataclass(frozen=True)
class ModelCallRecord:
    id: str
    session_id: str
    tenant: str
    agent_name: str
    sandbox_id: str
    query_id: str | None
    endpoint: str  # messages | count_tokens | the path asked for, when it was not forwarded
    model: str | None  # the model the call asked for
    stream: bool
    max_tokens: int | None
    status: int  # the HTTP status the sandbox got
    outcome: str  # ok | error | refused | aborted
    reason: str | None  # refusal reason, or the API's error type
    detail: str | None
    input_tokens: int
    output_tokens: int
    cache_creation_tokens: int
    cache_read_tokens: int
    cost_usd: float
    latency_ms: float
    first_byte_ms: float | None
    created_at: dt.datetime
    server: str

    def to_json(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["created_at"] = self.created_at.isoformat()
        return out


_CALLS = cast(Table, ModelCall.__table__)
_SESSIONS = cast(Table, Session.__table__)
_USAGE = cast(Table, UsageEvent.__table__)
_ALLOCATE = (update(_SESSIONS).where(_SESSIONS.c.id == bindparam("_id"))
             .values(next_model_call_seq=_SESSIONS.c.next_model_call_seq + bindparam("_count"))
             .returning(_SESSIONS.c.next_model_call_seq))
_INSERT_CALLS, _INSERT_USAGE = insert(_CALLS), insert(_USAGE)
_USAGE_FIELDS = (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                 ("cache_creation_tokens", "cache_creation_tokens"), ("cache_read_tokens", "cache_read_tokens"),
                 ("cost_usd", "cost_usd"))


def _usage_rows(rec: ModelCallRecord) -> list[dict[str, Any]]:
    rows = []
    for event_type, attr in _USAGE_FIELDS:
        value = float(getattr(rec, attr))
        if value > 0:
            rows.append({"id": new_id(), "tenant_id": rec.tenant, "session_id": rec.session_id,
                         "agent_name": rec.agent_name, "event_type": event_type, "value": value,
                         "created_at": rec.created_at})
    return rows


def _call_row(rec: ModelCallRecord, sequence: int) -> dict[str, Any]:
    return {
        "id": rec.id, "tenant_id": rec.tenant, "session_id": rec.session_id, "sequence": sequence,
        "agent_name": rec.agent_name, "sandbox_id": rec.sandbox_id, "query_id": rec.query_id,
        "endpoint": rec.endpoint, "model": rec.model, "stream": rec.stream, "max_tokens": rec.max_tokens,
        "status": rec.status, "outcome": rec.outcome, "reason": rec.reason, "detail": rec.detail,
        "input_tokens": rec.input_tokens, "output_tokens": rec.output_tokens,
        "cache_creation_tokens": rec.cache_creation_tokens, "cache_read_tokens": rec.cache_read_tokens,
        "cost_usd": rec.cost_usd, "latency_ms": rec.latency_ms, "first_byte_ms": rec.first_byte_ms,
        "server": rec.server, "created_at": rec.created_at,
    }


def insert_model_calls(x: Statements, records: Sequence[ModelCallRecord]) -> None:
    """`records` with their usage events, in the caller's transaction: a batch of the proxy's record
    writer, or a turn's last batch (its own calls, stored with its `done`)."""
    by_session: dict[str, list[ModelCallRecord]] = defaultdict(list)
    for rec in records:
        by_session[rec.session_id].append(rec)
    calls: list[dict[str, Any]] = []
    usage: list[dict[str, Any]] = []
    for session_id in sorted(by_session):
        recs = sorted(by_session[session_id], key=lambda r: r.created_at)
        allocated = x.rows(_ALLOCATE, {"_id": session_id, "_count": len(recs)})
        # A session row that is gone still gets its calls stored (sequence 0): spend is never dropped.
        first = int(allocated[0]["next_model_call_seq"]) - len(recs) + 1 if allocated else 0
        for i, rec in enumerate(recs):
            calls.append(_call_row(rec, first + i if allocated else 0))
            usage.extend(_usage_rows(rec))
    x.run_many(_INSERT_CALLS, calls)
    x.run_many(_INSERT_USAGE, usage)


async def store_model_calls(db: Database, records: Sequence[ModelCallRecord]) -> None:
    if records:
        await db.run_direct(lambda x: insert_model_calls(x, records))  # prebuilt statements, one hop


def call_json(r: ModelCall) -> dict[str, Any]:
    return {
        "id": r.id, "sessionId": r.session_id, "tenantId": r.tenant_id, "agentName": r.agent_name,
        "sequence": r.sequence, "endpoint": r.endpoint, "model": r.model, "stream": r.stream,
        "maxTokens": r.max_tokens, "status": r.status, "outcome": r.outcome, "reason": r.reason,
        "detail": r.detail, "inputTokens": r.input_tokens, "outputTokens": r.output_tokens,
        "cacheCreationTokens": r.cache_creation_tokens, "cacheReadTokens": r.cache_read_tokens,
        "costUsd": round(r.cost_usd, 8), "latencyMs": round(r.latency_ms, 3),
        "firstByteMs": None if r.first_byte_ms is None else round(r.first_byte_ms, 3),
        "sandboxId": r.sandbox_id, "queryId": r.query_id, "server": r.server, "createdAt": iso(r.created_at),
    }


async def list_model_calls(db: Database, tenant: str, session_id: str, after: int,
                           limit: int) -> builtins.list[dict[str, Any]]:
    query = (select(ModelCall).where(ModelCall.session_id == session_id, ModelCall.tenant_id == tenant,
                                     ModelCall.sequence > after)
             .order_by(ModelCall.sequence, ModelCall.created_at).limit(limit))
    rows = await db.run_read(lambda s: s.execute(query).scalars().all())  # one hop, as the sums below
    return [call_json(r) for r in rows]


async def session_spend(db: Database, session_id: str) -> float:
    query = select(func.sum(ModelCall.cost_usd)).where(ModelCall.session_id == session_id)
    return float(await db.run_read(lambda s: s.execute(query).scalar_one()) or 0.0)


async def tenant_spend(db: Database, tenant: str, since: dt.datetime) -> float:
    query = select(func.sum(ModelCall.cost_usd)).where(ModelCall.tenant_id == tenant, ModelCall.created_at >= since)
    return float(await db.run_read(lambda s: s.execute(query).scalar_one()) or 0.0)
