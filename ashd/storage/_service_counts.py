"""What `GET /health` and `GET /metrics` read of the whole service, in one statement and one hop.

Load balancers and monitors poll /health every few seconds, from several places at once. Read as
two ORM queries through aiosqlite (a thread trip per statement), it took 2.7 ms and 2.4 ms of the
server's CPU a call (docs/performance.md, fifteenth pass); the statement below is built once and
runs in one trip to a reader thread (`Database.run_read`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session as SyncSession

from ashd.storage._apikeys import DEFAULT_TENANT
from ashd.storage._models import ApiKey, Session

if TYPE_CHECKING:
    from ashd.storage._database import Database

_ACTIVE = select(func.count()).select_from(Session).where(Session.status == "active").scalar_subquery()
_OTHER_TENANTS = select(ApiKey.id).where(ApiKey.tenant_id != DEFAULT_TENANT).exists()
_COUNTS = select(_ACTIVE.label("active"), _OTHER_TENANTS.label("other_tenants"))


@dataclass(frozen=True)
class ServiceCounts:
    active_sessions: int  # sessions in `active` status, every tenant's
    other_tenants: bool  # some API key belongs to a tenant other than `default`


async def service_counts(db: Database) -> ServiceCounts:
    def run(s: SyncSession) -> ServiceCounts:
        row = s.execute(_COUNTS).one()
        return ServiceCounts(int(row.active), bool(row.other_tenants))

    return await db.run_read(run)
