"""The runner registry in the shared database (coordinators are stateless; the database is the truth).

Liveness (docs/liveness.md): a runner is alive while its last heartbeat is younger than the liveness
timeout and no sweep marked it dead. `sweep_dead` runs on every coordinator; of several sweeping at
once exactly one wins each dead runner, by a conditional update of the runner row, and pauses its
sessions in the same transaction, so they are paused once and never left active by a sweep that
died halfway.
"""

from __future__ import annotations

import builtins
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, select, update

from ashd.errors import NotFound
from ashd.storage._database import Database
from ashd.storage._models import Runner, Session, iso, utcnow
from ashd.storage._sessions import Sessions, pause_selected

# A runner marked dead that never came back is forgotten after this long (it stays listed until then).
FORGET_DEAD_AFTER = dt.timedelta(days=1)

# Read in one hop each (`Database.run_read`): a coordinator's /health counts the runners at every probe.
_KNOWN = select(Runner.id).where(Runner.id == bindparam("id"))
_BY_REGISTRATION = select(Runner).order_by(Runner.registered_at)
_BY_ID = select(Runner).order_by(Runner.id)
_SILENT = select(Runner.id).where(Runner.dead_at.is_(None), Runner.last_heartbeat_at < bindparam("cutoff"))


def runner_json(row: Runner, liveness_seconds: float | None = None) -> dict[str, Any]:
    out = {"runnerId": row.id, "host": row.host, "port": row.port, "maxSandboxes": row.max_sandboxes,
           "activeCount": row.active_count, "warmingCount": row.warming_count,
           "runningCount": row.running_count, "stats": json.loads(row.stats or "{}"),
           "registeredAt": iso(row.registered_at), "lastHeartbeatAt": iso(row.last_heartbeat_at)}
    if liveness_seconds is not None:
        out["alive"] = is_alive(row, utcnow(), liveness_seconds)
    if row.dead_at is not None:
        out["deadAt"] = iso(row.dead_at)
    return out


def is_alive(row: Runner, now: dt.datetime, liveness_seconds: float) -> bool:
    return row.dead_at is None and row.last_heartbeat_at > now - dt.timedelta(seconds=liveness_seconds)


@dataclass(frozen=True)
class SweptRunner:
    """A runner this sweep found dead and won: the sessions it paused."""

    runner_id: str
    paused: list[str]


class Runners:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def register(self, runner_id: str, host: str, port: int, max_sandboxes: int) -> None:
        now = utcnow()
        async with self.db.tx() as s:
            found = await s.execute(update(Runner).where(Runner.id == runner_id).values(
                host=host, port=port, max_sandboxes=max_sandboxes, last_heartbeat_at=now, dead_at=None))
            if found.rowcount == 0:  # type: ignore[attr-defined]
                s.add(Runner(id=runner_id, host=host, port=port, max_sandboxes=max_sandboxes,
                             registered_at=now, last_heartbeat_at=now))

    async def heartbeat(self, runner_id: str, stats: dict[str, Any], active_count: int) -> None:
        """404 for a runner that is unknown or was marked dead: it registers again (its sessions
        were paused meanwhile and are not resumed by a heartbeat)."""
        async with self.db.tx() as s:
            found = await s.execute(update(Runner).where(Runner.id == runner_id, Runner.dead_at.is_(None)).values(
                active_count=active_count, warming_count=int(stats.get("warming", 0)),
                running_count=int(stats.get("running", 0)), stats=json.dumps(stats),
                last_heartbeat_at=utcnow()))
            if found.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"Runner {runner_id} is not registered; register it again")

    async def deregister(self, runner_id: str) -> list[str]:
        """Pause the runner's sessions in one bulk update, then remove the runner."""
        known = await self.db.run_read(lambda s: s.execute(_KNOWN, {"id": runner_id}).scalar_one_or_none())
        if known is None:
            raise NotFound(f"Runner {runner_id} is not registered")
        paused = await Sessions(self.db).pause_orphans(runner_id=runner_id, reason="runner_deregistered")
        async with self.db.tx() as s:
            await s.execute(delete(Runner).where(Runner.id == runner_id))
        return paused

    async def list(self, liveness_seconds: float | None = None) -> list[dict[str, Any]]:
        rows = await self.db.run_read(lambda s: s.execute(_BY_REGISTRATION).scalars().all())
        return [runner_json(r, liveness_seconds) for r in rows]

    async def counts(self, liveness_seconds: float) -> dict[str, int]:
        """Runners by state: `alive`, `stale` (heartbeat late, not yet swept), `dead` (swept)."""
        now = utcnow()
        out = {"alive": 0, "stale": 0, "dead": 0}
        for row in await self.rows():  # a handful of rows: counted here, the same on both databases
            out["dead" if row.dead_at is not None else "alive" if is_alive(row, now, liveness_seconds)
                else "stale"] += 1
        return out

    async def rows(self) -> builtins.list[Runner]:
        return await self.db.run_read(lambda s: list(s.execute(_BY_ID).scalars().all()))

    async def sweep_dead(self, liveness_seconds: float) -> builtins.list[SweptRunner]:
        """Mark runners silent for `liveness_seconds` dead and pause their `active`/`starting`
        sessions (reason `runner_lost`), one transaction per runner.

        The conditional update `... WHERE id = ? AND dead_at IS NULL AND last_heartbeat_at < cutoff`
        decides which of several sweeping coordinators does it: PostgreSQL makes the others wait on
        the row lock and re-check the condition (then false), SQLite has one writer at a time. A
        heartbeat that lands first keeps the runner alive.
        """
        now = utcnow()
        cutoff = now - dt.timedelta(seconds=liveness_seconds)
        stale = await self.db.run_read(lambda s: list(s.execute(_SILENT, {"cutoff": cutoff}).scalars()))
        swept: builtins.list[SweptRunner] = []
        for runner_id in stale:
            async with self.db.tx() as s:
                won = await s.execute(update(Runner).where(
                    Runner.id == runner_id, Runner.dead_at.is_(None), Runner.last_heartbeat_at < cutoff,
                ).values(dead_at=now))
                if won.rowcount != 1:  # type: ignore[attr-defined]
                    continue  # another coordinator won it, or it came back
                query = select(Session.id, Session.tenant_id, Session.turn_open).where(
                    Session.runner_id == runner_id, Session.status.in_(("active", "starting")))
                paused = await pause_selected(s, query, "runner_lost")
            swept.append(SweptRunner(runner_id, paused))
        async with self.db.tx() as s:
            await s.execute(delete(Runner).where(Runner.dead_at.is_not(None), Runner.dead_at < now - FORGET_DEAD_AFTER))
        return swept
