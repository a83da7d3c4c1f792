"""Webhooks of a tenant and their delivery outbox.

A delivery is a row before it is a request: `enqueue` stores one row per subscribed hook, and the
dispatcher (ashd.actors) claims due rows, sends them and records each attempt. A claim is a lease
(`next_attempt_at` moves past the attempt's timeout), so a row whose sender died is claimed again
once the lease runs out, on this server or another one sharing the database: nothing is lost to a
crash, and a row is sent by one coordinator at a time.

The signing secret is stored encrypted (the hook's id is the associated data) because signing
needs it in clear; it is shown once, when the hook is created.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, delete, func, select, update

from ashd.errors import Conflict, NotFound
from ashd.storage._crypto import Cipher
from ashd.storage._database import Database
from ashd.storage._models import Webhook, WebhookDelivery, iso, new_id, utcnow

WEBHOOK_EVENTS = ("turn.completed", "session.status_changed", "queue.item_finished")
DELIVERY_STATUSES = ("pending", "sending", "delivered", "failed")
MAX_WEBHOOKS_PER_TENANT = 50
SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of generated secrets, not a secret


def webhook_json(row: Webhook) -> dict[str, Any]:
    return {"id": row.id, "url": row.url, "events": json.loads(row.events), "description": row.description,
            "enabled": row.enabled, "createdAt": iso(row.created_at), "updatedAt": iso(row.updated_at)}


def delivery_json(row: WebhookDelivery) -> dict[str, Any]:
    return {"id": row.id, "webhookId": row.webhook_id, "event": row.event, "status": row.status,
            "attempts": row.attempts, "lastStatusCode": row.last_status_code, "lastError": row.last_error,
            "nextAttemptAt": iso(row.next_attempt_at) if row.status in ("pending", "sending") else None,
            "createdAt": iso(row.created_at), "updatedAt": iso(row.updated_at),
            "deliveredAt": iso(row.delivered_at)}


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery the dispatcher holds the lease of, with what it needs to send it."""

    id: str
    webhook_id: str
    event: str
    url: str
    secret: str
    body: str
    attempt: int  # 1 for the first


# The hooks that may hear an event: each one's id, events and since when it listens.
_HOOKS = select(Webhook.id, Webhook.events,
                func.coalesce(Webhook.listening_since, Webhook.created_at).label("since"))
_ENABLED_HOOKS = _HOOKS.where(Webhook.tenant_id == bindparam("tenant"), Webhook.enabled.is_(True))
_ONE_HOOK = _HOOKS.where(Webhook.tenant_id == bindparam("tenant"), Webhook.id == bindparam("id"))


class Webhooks:
    def __init__(self, db: Database, cipher: Cipher) -> None:
        self._db = db
        self._cipher = cipher
        # (tenant, event) pairs known to have no enabled hook: every session status change asks, and
        # most tenants have none. Only on SQLite, where this process owns the database, so every
        # hook change goes through `_changed` here; with PostgreSQL other processes change hooks.
        self._unheard: set[tuple[str, str]] = set()
        self._cacheable = db.dialect == "sqlite"
        self._generation = 0  # bumped after each committed hook change

    def _changed(self) -> None:
        """After a hook change commits: forget what was known (an enqueue reading meanwhile sees the
        generation move and does not cache its answer)."""
        self._generation += 1
        self._unheard.clear()

    def known_unheard(self, tenant: str, event: str) -> bool:
        """True when `tenant` is known to have no enabled hook for `event` (a set lookup, from any
        thread): the event need not be handed to the loop at all."""
        return (tenant, event) in self._unheard

    # --- hooks ---------------------------------------------------------------------------------
    async def create(self, tenant: str, url: str, events: list[str], description: str | None) -> tuple[Webhook, str]:
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        row_id = new_id()
        async with self._db.tx() as s:
            count = (await s.execute(select(func.count()).select_from(Webhook)
                                     .where(Webhook.tenant_id == tenant))).scalar_one()
            if count >= MAX_WEBHOOKS_PER_TENANT:
                raise Conflict(f"This tenant has {count} webhooks, the most allowed "
                               f"({MAX_WEBHOOKS_PER_TENANT}); delete one first")
            now = utcnow()
            row = Webhook(id=row_id, tenant_id=tenant, url=url, events=json.dumps(events), description=description,
                          secret=self._cipher.encrypt(secret.encode(), row_id.encode()), enabled=True,
                          created_at=now, updated_at=now)
            s.add(row)
            await s.flush()
            s.expunge(row)
        self._changed()
        return row, secret

    async def list(self, tenant: str) -> builtins.list[Webhook]:
        query = select(Webhook).where(Webhook.tenant_id == tenant).order_by(Webhook.created_at)
        return builtins.list(await self._db.run_read(lambda s: s.execute(query).scalars().all()))  # one hop

    async def get(self, tenant: str, webhook_id: str) -> Webhook:
        query = select(Webhook).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant)
        row = await self._db.run_read(lambda s: s.execute(query).scalar_one_or_none())
        if row is None:
            raise NotFound(f"Webhook {webhook_id} not found")
        return row

    async def update(self, tenant: str, webhook_id: str, **values: Any) -> Webhook:
        if "events" in values:
            values["events"] = json.dumps(values["events"])
        now = utcnow()
        if values.get("enabled") is True:  # a disabled hook hears from now on, not what happened while it was off
            values["listening_since"] = case((Webhook.enabled.is_(True), Webhook.listening_since), else_=now)
        async with self._db.tx() as s:
            result = await s.execute(update(Webhook).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant)
                                     .values(updated_at=now, **values))
            if not result.rowcount:  # type: ignore[attr-defined]
                raise NotFound(f"Webhook {webhook_id} not found")
        self._changed()
        return await self.get(tenant, webhook_id)

    async def delete(self, tenant: str, webhook_id: str) -> None:
        async with self._db.tx() as s:
            result = await s.execute(delete(Webhook).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant))
            if not result.rowcount:  # type: ignore[attr-defined]
                raise NotFound(f"Webhook {webhook_id} not found")
            await s.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id))
        self._changed()

    async def deliveries(self, tenant: str, webhook_id: str, limit: int) -> builtins.list[WebhookDelivery]:
        await self.get(tenant, webhook_id)  # 404 for another tenant's hook
        query = (select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
                 .order_by(WebhookDelivery.created_at.desc()).limit(limit))
        return builtins.list(await self._db.run_read(lambda s: s.execute(query).scalars().all()))

    # --- the outbox ----------------------------------------------------------------------------
    async def enqueue(self, tenant: str, event: str, data: dict[str, Any], *,
                      webhook_id: str | None = None, occurred_at: dt.datetime | None = None) -> builtins.list[str]:
        """One pending delivery per enabled hook of `tenant` subscribed to `event` (or the one hook
        named, whatever it subscribes to: a test delivery). Returns the delivery ids. `occurred_at`:
        when the event happened; a hook created or enabled again after it does not hear it (the event
        is stored a moment later, and its client may have added or enabled a hook meanwhile)."""
        # Every session status change and every turn's end comes here, mostly for tenants with no
        # hook: answered from memory before anything is built (a query costs more than the rest).
        if webhook_id is None and (tenant, event) in self._unheard:
            return []
        query, params = (_ONE_HOOK, {"tenant": tenant, "id": webhook_id}) if webhook_id else \
            (_ENABLED_HOOKS, {"tenant": tenant})
        # A read answers the rest without taking SQLite's write lock, which the next transition (a
        # resume right after a pause) would otherwise wait for; on PostgreSQL, one statement on the
        # driver (`Database.read_rows`), not an ORM session around it. A hook added after the event
        # is left out below (`occurred_at`); whether there is one at all is decided on every hook.
        generation = self._generation
        listening = await self._db.read_rows(query, params)
        if not any(webhook_id or event in json.loads(row["events"]) for row in listening):
            if webhook_id is None and self._cacheable and generation == self._generation:
                self._unheard.add((tenant, event))
            return []
        async with self._db.tx() as s:
            hooks = [hid for hid, events, since in (await s.execute(query, params)).all()
                     if webhook_id or (event in json.loads(events)
                                       and (occurred_at is None or since <= occurred_at))]
            now = utcnow()
            ids: builtins.list[str] = []
            for hook in hooks:
                delivery_id = new_id()
                body = json.dumps({"id": delivery_id, "event": event, "createdAt": iso(now), "tenantId": tenant,
                                   "webhookId": hook, "data": data}, separators=(",", ":"), ensure_ascii=False)
                s.add(WebhookDelivery(id=delivery_id, webhook_id=hook, tenant_id=tenant, event=event, body=body,
                                      status="pending", attempts=0, next_attempt_at=now, created_at=now,
                                      updated_at=now))
                ids.append(delivery_id)
        return ids

    async def due(self, limit: int) -> builtins.list[str]:
        """Ids of deliveries that may be claimed now (pending, or sending with a lapsed lease)."""
        query = (select(WebhookDelivery.id).where(WebhookDelivery.status.in_(("pending", "sending")),
                                                  WebhookDelivery.next_attempt_at <= utcnow())
                 .order_by(WebhookDelivery.next_attempt_at).limit(limit))
        return builtins.list(await self._db.run_read(lambda s: s.execute(query).scalars().all()))

    async def next_due(self) -> dt.datetime | None:
        query = select(func.min(WebhookDelivery.next_attempt_at)).where(
            WebhookDelivery.status.in_(("pending", "sending")))
        found: dt.datetime | None = await self._db.run_read(lambda s: s.execute(query).scalar_one_or_none())
        return found

    async def claim(self, delivery_id: str, lease_seconds: float) -> ClaimedDelivery | None:
        """Take the lease of one due delivery; None when another sender took it first, or its hook is
        gone or disabled (the delivery is then marked failed)."""
        now = utcnow()
        async with self._db.tx() as s:
            result = await s.execute(
                update(WebhookDelivery).where(WebhookDelivery.id == delivery_id,
                                              WebhookDelivery.status.in_(("pending", "sending")),
                                              WebhookDelivery.next_attempt_at <= now)
                .values(status="sending", attempts=WebhookDelivery.attempts + 1, updated_at=now,
                        next_attempt_at=now + dt.timedelta(seconds=lease_seconds)))
            if not result.rowcount:  # type: ignore[attr-defined]
                return None
            row = (await s.execute(select(WebhookDelivery).where(WebhookDelivery.id == delivery_id))).scalar_one()
            hook = (await s.execute(select(Webhook).where(Webhook.id == row.webhook_id))).scalar_one_or_none()
            if hook is None or not hook.enabled:
                row.status, row.last_error = "failed", "the webhook was disabled or deleted before delivery"
                return None
            secret = self._cipher.decrypt(hook.secret, hook.id.encode()).decode()
            return ClaimedDelivery(row.id, hook.id, row.event, hook.url, secret, row.body, row.attempts)

    async def record(self, delivery_id: str, *, delivered: bool, status_code: int | None, error: str | None,
                     retry_in: float | None) -> None:
        """The outcome of an attempt: delivered, retried after `retry_in` seconds, or failed (None)."""
        now = utcnow()
        values: dict[str, Any] = {"last_status_code": status_code, "last_error": error, "updated_at": now}
        if delivered:
            values.update(status="delivered", delivered_at=now)
        elif retry_in is not None:
            values.update(status="pending", next_attempt_at=now + dt.timedelta(seconds=retry_in))
        else:
            values.update(status="failed")
        async with self._db.tx() as s:
            await s.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values))

    async def release(self, delivery_id: str) -> None:
        """An attempt cut short by a stopping server: due again now, and not counted."""
        now = utcnow()
        async with self._db.tx() as s:
            await s.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id,
                                                          WebhookDelivery.status == "sending")
                            .values(status="pending", next_attempt_at=now, updated_at=now,
                                    attempts=WebhookDelivery.attempts - 1))
