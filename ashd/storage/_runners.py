"""The runner registry in the shared database (coordinators are stateless; the database is the truth)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, select, update

from ashd.errors import NotFound
from ashd.storage._database import Database
from ashd.storage._models import Runner, iso, utcnow
from ashd.storage._sessions import Sessions


def runner_json(row: Runner) -> dict[str, Any]:
    return {"runnerId": row.id, "host": row.host, "port": row.port, "maxSandboxes": row.max_sandboxes,
            "activeCount": row.active_count, "warmingCount": row.warming_count,
            "runningCount": row.running_count, "stats": json.loads(row.stats or "{}"),
            "registeredAt": iso(row.registered_at), "lastHeartbeatAt": iso(row.last_heartbeat_at)}


class Runners:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def register(self, runner_id: str, host: str, port: int, max_sandboxes: int) -> None:
        now = utcnow()
        async with self.db.tx() as s:
            found = await s.execute(update(Runner).where(Runner.id == runner_id).values(
                host=host, port=port, max_sandboxes=max_sandboxes, last_heartbeat_at=now))
            if found.rowcount == 0:  # type: ignore[attr-defined]
                s.add(Runner(id=runner_id, host=host, port=port, max_sandboxes=max_sandboxes,
                             registered_at=now, last_heartbeat_at=now))

    async def heartbeat(self, runner_id: str, stats: dict[str, Any], active_count: int) -> None:
        async with self.db.tx() as s:
            found = await s.execute(update(Runner).where(Runner.id == runner_id).values(
                active_count=active_count, warming_count=int(stats.get("warming", 0)),
                running_count=int(stats.get("running", 0)), stats=json.dumps(stats),
                last_heartbeat_at=utcnow()))
            if found.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"Runner {runner_id} is not registered; register it again")

    async def deregister(self, runner_id: str) -> list[str]:
        """Pause the runner's sessions in one bulk update, then remove the runner."""
        async with self.db.read() as s:
            known = (await s.execute(select(Runner.id).where(Runner.id == runner_id))).scalar_one_or_none()
        if known is None:
            raise NotFound(f"Runner {runner_id} is not registered")
        paused = await Sessions(self.db).pause_orphans(runner_id=runner_id, reason="runner_deregistered")
        async with self.db.tx() as s:
            await s.execute(delete(Runner).where(Runner.id == runner_id))
        return paused

    async def list(self) -> list[dict[str, Any]]:
        async with self.db.read() as s:
            rows = (await s.execute(select(Runner).order_by(Runner.registered_at))).scalars().all()
        return [runner_json(r) for r in rows]
