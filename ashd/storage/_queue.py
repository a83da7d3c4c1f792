"""Queue items: prompts waiting to run as turns, and the claims that make each run exactly once.

A server claims an item with a conditional update (`status = 'pending'` still true), so two servers
on one database can never both take it; on PostgreSQL the claims are serialised by a transaction
advisory lock as well, which makes the per-tenant concurrency bound exact across servers (SQLite
has one writer). A claim carries its `owner` and a lease (`lease_until`) the owner renews while the
item runs; an item whose lease ran out belongs to a server that died, and goes back to `pending`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select, text, update
from sqlalchemy.orm import Session as SyncSession

from ashd.errors import BadRequest, NotFound
from ashd.storage._database import Database
from ashd.storage._models import QueueItem, iso, new_id, utcnow

QUEUE_STATUSES = ("pending", "processing", "completed", "failed", "cancelled")
_CLAIM_LOCK_ID = 0x61736871  # "ashq": PostgreSQL advisory lock of queue claims
_CANDIDATES = 32  # pending items looked at per claim (enough to step over tenants at their bound)


def queue_item_json(row: QueueItem) -> dict[str, Any]:
    """The wire form (ash-ai-sdk `QueueItem`), plus `result` and `nextAttemptAt`."""
    return {
        "id": row.id, "tenantId": row.tenant_id, "agentName": row.agent_name, "prompt": row.prompt,
        "status": row.status, "priority": row.priority, "retryCount": row.retry_count,
        "maxRetries": row.max_retries, "sessionId": row.session_id, "error": row.error, "result": row.result,
        "createdAt": iso(row.created_at), "startedAt": iso(row.started_at), "completedAt": iso(row.completed_at),
        "nextAttemptAt": iso(row.next_attempt_at),
    }


@dataclass(frozen=True)
class Claimed:
    """An item a server has claimed: what running it needs."""

    id: str
    tenant: str
    agent_name: str
    prompt: str
    session_id: str | None
    retry_count: int
    max_retries: int


@dataclass(frozen=True)
class Backoff:
    """Retry delays: `base_s * 2**retries`, at most `max_s`."""

    base_s: float = 5.0
    max_s: float = 300.0

    def delay(self, retries_done: int) -> float:
        return float(min(self.max_s, self.base_s * (2 ** min(retries_done, 30))))


class QueueItems:
    def __init__(self, db: Database) -> None:
        self.db = db

    # --- the API's operations ------------------------------------------------------------------
    async def add(self, tenant: str, agent_name: str, prompt: str, session_id: str | None, priority: int,
                  max_retries: int) -> dict[str, Any]:
        row = QueueItem(id=new_id(), tenant_id=tenant, agent_name=agent_name, prompt=prompt,
                        session_id=session_id, priority=priority, max_retries=max_retries, status="pending",
                        retry_count=0, created_at=utcnow())
        async with self.db.tx() as s:
            s.add(row)
        return queue_item_json(row)

    async def get(self, tenant: str, item_id: str) -> dict[str, Any]:
        row = await self.db.run_read(lambda s: s.get(QueueItem, item_id))  # one hop, as the reads below
        if row is None or row.tenant_id != tenant:
            raise NotFound(f"Queue item {item_id} not found")
        return queue_item_json(row)

    async def listing(self, tenant: str, status: str | None, limit: int) -> list[dict[str, Any]]:
        """Newest first."""
        query = select(QueueItem).where(QueueItem.tenant_id == tenant)
        if status is not None:
            query = query.where(QueueItem.status == status)
        query = query.order_by(QueueItem.created_at.desc()).limit(limit)
        rows = await self.db.run_read(lambda s: s.execute(query).scalars().all())
        return [queue_item_json(r) for r in rows]

    async def stats(self, tenant: str | None) -> dict[str, int]:
        """Items per status, of one tenant or (None) of all."""
        query = select(QueueItem.status, func.count()).group_by(QueueItem.status)
        if tenant is not None:
            query = query.where(QueueItem.tenant_id == tenant)
        counts = {status: int(n) for status, n in await self.db.run_read(lambda s: s.execute(query).all())}
        return {status: counts.get(status, 0) for status in QUEUE_STATUSES}

    async def open_count(self, tenant: str) -> int:
        """The tenant's items still to finish (`pending` or `processing`)."""
        query = select(func.count()).select_from(QueueItem).where(
            QueueItem.tenant_id == tenant, QueueItem.status.in_(("pending", "processing")))
        return int(await self.db.run_read(lambda s: s.execute(query).scalar_one()))

    async def cancel(self, tenant: str, item_id: str) -> dict[str, Any]:
        now = utcnow()
        async with self.db.tx() as s:
            done = await s.execute(update(QueueItem).where(
                QueueItem.id == item_id, QueueItem.tenant_id == tenant, QueueItem.status == "pending",
            ).values(status="cancelled", completed_at=now, next_attempt_at=None))
        item = await self.get(tenant, item_id)  # 404 for an unknown item or another tenant's
        if not done.rowcount:  # type: ignore[attr-defined]
            raise BadRequest(f"Queue item {item_id} is {item['status']}: only pending items can be cancelled")
        return item

    # --- claims (the queue actor's work) -------------------------------------------------------
    async def claim(self, owner: str, lease_s: float, per_tenant: int, count: int) -> list[Claimed]:
        """Claim up to `count` due items, by priority (highest first) then age, leaving out tenants
        that already run `per_tenant` items (on any server)."""
        # Most ticks find nothing: a read in one hop, no write transaction for them.
        query = select(QueueItem.id).where(QueueItem.status == "pending", _due(utcnow())).limit(1)
        due = await self.db.run_read(lambda s: s.execute(query).first())
        if due is None:
            return []
        return await self.db.run_tx(lambda s: _claim(s, owner, lease_s, per_tenant, count))

    async def renew(self, owner: str, item_ids: Collection[str], lease_s: float) -> int:
        """Extend the leases of the items the owner is running (its heartbeat). Only those: an item
        whose run ended without its outcome being stored (the database was down) runs out its lease."""
        if not item_ids:
            return 0
        async with self.db.tx() as s:
            done = await s.execute(update(QueueItem).where(
                QueueItem.owner == owner, QueueItem.status == "processing", QueueItem.id.in_(list(item_ids)),
            ).values(lease_until=utcnow() + dt.timedelta(seconds=lease_s)))
        return int(done.rowcount or 0)  # type: ignore[attr-defined]

    async def reclaim_expired(self) -> int:
        """Items whose server stopped renewing their lease (it died) go back to `pending`."""
        async with self.db.tx() as s:
            done = await s.execute(update(QueueItem).where(
                QueueItem.status == "processing", QueueItem.lease_until < utcnow(),
            ).values(status="pending", owner=None, lease_until=None, next_attempt_at=None))
        return int(done.rowcount or 0)  # type: ignore[attr-defined]

    async def release(self, owner: str) -> int:
        """A server that stops gives its unfinished items back at once."""
        async with self.db.tx() as s:
            done = await s.execute(update(QueueItem).where(
                QueueItem.owner == owner, QueueItem.status == "processing",
            ).values(status="pending", owner=None, lease_until=None, next_attempt_at=None))
        return int(done.rowcount or 0)  # type: ignore[attr-defined]

    async def use_session(self, item_id: str, owner: str, session_id: str) -> None:
        """Record the session an item runs on as soon as it exists: a retry (or another server
        after a crash) goes on in the same session instead of starting another."""
        async with self.db.tx() as s:
            await s.execute(update(QueueItem).where(QueueItem.id == item_id, QueueItem.owner == owner)
                            .values(session_id=session_id))

    async def complete(self, item_id: str, owner: str, result: str | None) -> bool:
        """False when the claim was lost meanwhile (the lease ran out): the item is not ours to finish."""
        async with self.db.tx() as s:
            done = await s.execute(update(QueueItem).where(
                QueueItem.id == item_id, QueueItem.owner == owner, QueueItem.status == "processing",
            ).values(status="completed", result=result, error=None, completed_at=utcnow(), owner=None,
                     lease_until=None))
        return bool(done.rowcount)  # type: ignore[attr-defined]

    async def attempt_failed(self, item_id: str, owner: str, error: str, backoff: Backoff) -> str | None:
        """Back to `pending` after a delay, or `failed` once `maxRetries` retries are spent; the new
        status (None: the claim was lost meanwhile)."""
        return await self.db.run_tx(lambda s: _attempt_failed(s, item_id, owner, error, backoff))


def _due(now: dt.datetime) -> ColumnElement[bool]:
    return QueueItem.next_attempt_at.is_(None) | (QueueItem.next_attempt_at <= now)


def _claim(s: SyncSession, owner: str, lease_s: float, per_tenant: int, count: int) -> list[Claimed]:
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _CLAIM_LOCK_ID})
    now = utcnow()
    running: dict[str, int] = {tenant: int(n) for tenant, n in s.execute(
        select(QueueItem.tenant_id, func.count()).where(QueueItem.status == "processing")
        .group_by(QueueItem.tenant_id)).all()}
    candidates = s.execute(select(QueueItem).where(QueueItem.status == "pending", _due(now))
                           .order_by(QueueItem.priority.desc(), QueueItem.created_at, QueueItem.id)
                           .limit(_CANDIDATES)).scalars().all()
    claimed: list[Claimed] = []
    for row in candidates:
        if len(claimed) >= count:
            break
        if running.get(row.tenant_id, 0) >= per_tenant:
            continue
        # Conditional: a claim that raced with another server's (or a cancel) changes nothing.
        done = s.execute(update(QueueItem).where(QueueItem.id == row.id, QueueItem.status == "pending").values(
            status="processing", owner=owner, lease_until=now + dt.timedelta(seconds=lease_s), started_at=now,
            error=None))
        if not done.rowcount:  # type: ignore[attr-defined]
            continue
        running[row.tenant_id] = running.get(row.tenant_id, 0) + 1
        claimed.append(Claimed(row.id, row.tenant_id, row.agent_name, row.prompt, row.session_id, row.retry_count,
                               row.max_retries))
    return claimed


def _attempt_failed(s: SyncSession, item_id: str, owner: str, error: str, backoff: Backoff) -> str | None:
    row = s.get(QueueItem, item_id)
    if row is None or row.owner != owner or row.status != "processing":
        return None
    now = utcnow()
    row.error = error[:4000]
    row.owner, row.lease_until = None, None
    if row.retry_count >= row.max_retries:
        row.status, row.completed_at = "failed", now
    else:
        row.next_attempt_at = now + dt.timedelta(seconds=backoff.delay(row.retry_count))
        row.retry_count += 1
        row.status = "pending"
    return row.status
