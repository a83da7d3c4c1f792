"""What a tenant holds on the server, and its limits: the numbers behind `GET /api/storage` and the
409 a tenant gets when a count or its storage total is reached.

Held bytes are: uploaded agent folders (current and previous version), local workspace snapshots,
stored messages and events (with session configurations), and attachments. Each comes from a
counter its writer keeps (`agents.stored_bytes`, `sessions.stored_bytes`, the SnapshotBoard) or a
column (`attachments.size`), so the sum is a few indexed aggregates, never a scan of a tenant's
data. Live sandbox workspaces are not a tenant's holdings: they are bounded per sandbox by the
workspace quota and go when the sandbox goes.

Later kinds of stored data (file uploads, workspace bundles) plug in the same way: a
counter of their bytes per tenant added to `Holdings`, and a `require_room(tenant, adding=n)` before
each write.

The total is checked before work that stores more (a new session, a message, a deploy). A turn
already running is not cut at the tenant limit (it has its own bound, SERVICE_TURN_MAX_STORED_MB),
and neither is a snapshot at pause or stop (refusing it would lose the workspace): so a tenant can
exceed its total by what its running turns and snapshots add, and is then refused until it deletes.
The check reads a sum at most `_CACHE_SECONDS` old, or admits from one up to `_STALE_SECONDS` old
that leaves room while a new one is taken beside the request: a tenant can also exceed its total by
what it stored within that window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import BindParameter, bindparam, func, select
from sqlalchemy.orm import Session as SyncSession

from ashd.errors import QuotaExceeded
from ashd.storage._models import Agent, ApiKey, Attachment, Credential, Session

if TYPE_CHECKING:
    from ashd.storage._database import Database
    from ashd.storage._snapshots import SnapshotBoard

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_CACHE_SECONDS = 2.0  # the pre-check on the message path reuses a sum this fresh
# ... and admits, from a sum up to this old that leaves room, at once, while a new sum is taken
# beside the request: its cost grows with the tenant's sessions (12 ms at 10,000 on SQLite), and a
# client that writes every few seconds would otherwise wait for it each time (docs/performance.md,
# thirty-sixth pass). What it lets through is what the tenant stored within this window.
_STALE_SECONDS = 30.0
_REFRESH_AFTER_S = 0.1
_COUNTED: dict[str, Any] = {"agents": Agent, "credentials": Credential, "API keys": ApiKey}


class StorageLimits(Protocol):
    """The settings these limits come from (`ashd.config.Settings` has them): storage takes them by
    shape, so it depends on nothing above it."""

    @property
    def tenant_storage_mb(self) -> int: ...
    @property
    def tenant_max_agents(self) -> int: ...
    @property
    def tenant_max_credentials(self) -> int: ...
    @property
    def tenant_max_api_keys(self) -> int: ...
    @property
    def agent_max_upload_mb(self) -> int: ...
    @property
    def turn_max_stored_mb(self) -> int: ...
    @property
    def turn_max_events(self) -> int: ...
    @property
    def snapshots_keep(self) -> int: ...
    @property
    def snapshot_max_mb(self) -> int: ...
    @property
    def attachment_max_mb(self) -> int: ...


_TENANT: BindParameter[str] = bindparam("tenant")


def _of(table: Any, *columns: Any) -> list[Any]:
    return [select(c).select_from(table).where(table.c.tenant_id == _TENANT).scalar_subquery() for c in columns]


def _total(column: Any) -> Any:
    return func.coalesce(func.sum(column), 0)


_AGENTS, _SESSIONS = Agent.__table__, Session.__table__
_ATTACHMENTS = Attachment.__table__
# One statement (one trip to the database) of scalar subqueries, built once: building it took more
# of a create's time than running it (docs/performance.md, fourteenth pass).
_SUMS = select(*_of(_AGENTS, func.count(), _total(_AGENTS.c.stored_bytes)),
               *_of(_SESSIONS, func.count(), _total(_SESSIONS.c.message_count), _total(_SESSIONS.c.event_count),
                    _total(_SESSIONS.c.stored_bytes)),
               *_of(Credential.__table__, func.count()), *_of(ApiKey.__table__, func.count()),
               *_of(_ATTACHMENTS, func.count(), _total(_ATTACHMENTS.c.size)))
_SESSION_IDS = select(_SESSIONS.c.id).where(_SESSIONS.c.tenant_id == _TENANT)


@dataclass(frozen=True)
class Holdings:
    agents: int = 0
    agent_bytes: int = 0
    sessions: int = 0
    messages: int = 0
    events: int = 0
    history_bytes: int = 0
    snapshots: int = 0
    snapshot_bytes: int = 0
    credentials: int = 0
    api_keys: int = 0
    attachments: int = 0
    attachment_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.agent_bytes + self.history_bytes + self.snapshot_bytes + self.attachment_bytes


def _limit(value: int) -> int | None:
    return value or None  # 0 in a setting means "no limit"


class TenantStorage:
    def __init__(self, db: Database, board: SnapshotBoard | None, settings: StorageLimits) -> None:
        self._db = db
        self._board = board
        self._settings = settings
        self._recent: dict[str, tuple[float, int]] = {}  # tenant -> (when, total bytes)
        self._refreshing: dict[str, asyncio.Task[Holdings]] = {}  # sums taken beside a request

    @property
    def limit_bytes(self) -> int | None:
        mb = _limit(self._settings.tenant_storage_mb)
        return None if mb is None else mb * MIB

    def count_limit(self, kind: str) -> int | None:
        s = self._settings
        return _limit({"agents": s.tenant_max_agents, "credentials": s.tenant_max_credentials,
                       "API keys": s.tenant_max_api_keys}[kind])

    async def holdings(self, tenant: str) -> Holdings:
        with_snapshots = self._board is not None and self._board.sessions() > 0

        def read(s: SyncSession) -> tuple[Any, list[str]]:
            sums = s.execute(_SUMS, {"tenant": tenant}).one()
            # Snapshot sizes are per session on the board: their ids, only when there are any.
            ids = list(s.execute(_SESSION_IDS, {"tenant": tenant}).scalars()) if with_snapshots else []
            return sums, ids

        ((agents, agent_bytes, sessions, messages, events, history_bytes, credentials, api_keys, attachments,
          attachment_bytes), ids) = await self._db.run_read(read)
        snapshots, snapshot_bytes = self._board.totals(ids) if self._board is not None else (0, 0)
        held = Holdings(
            agents=int(agents), agent_bytes=int(agent_bytes), sessions=int(sessions),
            messages=int(messages), events=int(events),
            history_bytes=int(history_bytes), snapshots=snapshots, snapshot_bytes=snapshot_bytes,
            credentials=int(credentials), api_keys=int(api_keys),
            attachments=int(attachments), attachment_bytes=int(attachment_bytes),
        )
        self._recent[tenant] = (time.monotonic(), held.total_bytes)
        return held

    async def require_room(self, tenant: str, what: str, adding: int = 0) -> None:
        """409 when the tenant's held bytes (plus `adding`) would pass its storage limit."""
        limit = self.limit_bytes
        if limit is None:
            return
        recent = self._recent.get(tenant)
        if recent is not None and recent[1] + adding < limit:
            age = time.monotonic() - recent[0]
            if age < _CACHE_SECONDS:
                return
            if age < _STALE_SECONDS:
                self._refresh_soon(tenant)
                return
        total = (await self.holdings(tenant)).total_bytes
        if total + adding > limit or (adding == 0 and total >= limit):
            raise QuotaExceeded(
                f"Storage limit reached: this tenant holds {total / MIB:.1f} MiB of the {limit // MIB} MiB it may "
                f"store (SERVICE_TENANT_STORAGE_MB), so {what} is refused. GET /api/storage shows what it holds; "
                "delete agents or purge ended sessions (DELETE /api/sessions/{id}?purge=true) to make room")

    def _refresh_soon(self, tenant: str) -> None:
        """A new sum for `tenant`, taken beside the request that found the last one stale (one at a
        time per tenant)."""
        if tenant in self._refreshing:
            return
        task = asyncio.get_running_loop().create_task(self._refresh(tenant))
        self._refreshing[tenant] = task
        task.add_done_callback(lambda done: self._refreshed(tenant, done))

    async def _refresh(self, tenant: str) -> Holdings:
        # After the request's own first steps (a turn's start, its model call on its way): the sum's
        # work would otherwise share the interpreter and the CPUs with them.
        await asyncio.sleep(_REFRESH_AFTER_S)
        return await self.holdings(tenant)

    def _refreshed(self, tenant: str, task: asyncio.Task[Holdings]) -> None:
        self._refreshing.pop(tenant, None)
        if not task.cancelled() and task.exception() is not None:
            # The stale sum ages out: past _STALE_SECONDS the next check takes the sum itself.
            log.warning("summing a tenant's storage failed: %s", task.exception(), extra={"tenant": tenant})

    async def require_count_below(self, tenant: str, kind: str) -> None:
        """409 when the tenant already has as many `kind` ("agents", "credentials", "API keys") as allowed."""
        limit = self.count_limit(kind)
        if limit is None:
            return
        model = _COUNTED[kind]
        query = select(func.count()).select_from(model).where(model.tenant_id == tenant)
        have = int(await self._db.run_read(lambda s: s.execute(query).scalar_one()))
        if have >= limit:
            setting = {"agents": "SERVICE_TENANT_MAX_AGENTS", "credentials": "SERVICE_TENANT_MAX_CREDENTIALS",
                       "API keys": "SERVICE_TENANT_MAX_API_KEYS"}[kind]
            raise QuotaExceeded(f"Limit reached: this tenant has {have} {kind}, the most it may have ({setting}); "
                                f"delete one to add another")

    def to_json(self, tenant: str, held: Holdings) -> dict[str, Any]:
        s = self._settings
        return {
            "tenantId": tenant,
            "totalBytes": held.total_bytes,
            "limitBytes": self.limit_bytes,
            "agents": {"count": held.agents, "limit": self.count_limit("agents"), "bytes": held.agent_bytes,
                       "maxUploadBytes": s.agent_max_upload_mb * MIB},
            "sessions": {"count": held.sessions},
            "history": {"messages": held.messages, "events": held.events, "bytes": held.history_bytes,
                        "maxTurnBytes": s.turn_max_stored_mb * MIB, "maxTurnEvents": s.turn_max_events},
            "snapshots": {"count": held.snapshots, "bytes": held.snapshot_bytes,
                          "keepPerSession": s.snapshots_keep, "maxWorkspaceBytes": s.snapshot_max_mb * MIB},
            "credentials": {"count": held.credentials, "limit": self.count_limit("credentials")},
            "apiKeys": {"count": held.api_keys, "limit": self.count_limit("API keys")},
            "attachments": {"count": held.attachments, "bytes": held.attachment_bytes,
                            "maxBytes": s.attachment_max_mb * MIB},
        }
