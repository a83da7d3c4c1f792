"""GET /health and GET /metrics (no authentication)."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from sqlalchemy import func, select

from ashd import __version__
from ashd.actors._board import EMPTY_POOL_STATS
from ashd.http._json import ok
from ashd.http._keys import SERVICES
from ashd.metrics import CONTENT_TYPE
from ashd.services import Services
from ashd.storage import Session

routes = web.RouteTableDef()


def pool_stats(services: Services) -> Mapping[str, int]:
    board = getattr(services.pool, "board", None)
    return board.read() if board is not None else EMPTY_POOL_STATS


async def active_sessions(services: Services) -> int:
    async with services.db.read() as s:
        return int((await s.execute(select(func.count()).select_from(Session).where(Session.status == "active")))
                   .scalar_one())


async def warnings(services: Services) -> list[str]:
    """Configuration an operator should fix, also logged at start (`ashd.app`)."""
    from ashd.storage._agent_paths import roots_warning

    found = roots_warning(bool(services.settings.agent_root_paths), await services.api_keys.has_other_tenants())
    return [found] if found else []


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    stats = pool_stats(services)
    body: dict[str, object] = {
        "status": "ok",
        "version": __version__,
        "coordinatorId": services.coordinator_id,
        "activeSessions": await active_sessions(services),
        "activeSandboxes": sum(stats.get(s, 0) for s in ("warming", "warm", "waiting", "running")),
        "uptime": services.uptime(),
        "pool": dict(stats),
        "mode": services.settings.mode,
        "warnings": await warnings(services),
    }
    if services.runners is not None:
        body["remoteRunners"] = int(services.extras.get("remote_runners", 0))
    if services.data_space is not None:
        space = services.data_space
        body["dataDir"] = space.measure().to_json(space.min_free, space.warn_free)
    iso = services.isolation
    if iso is not None:
        body["isolation"] = {
            "bwrap": iso.bwrap, "cgroups": iso.cgroups, "weak": iso.weak, "detail": iso.detail,
            # The profile in force for every sandbox, and how many agents the operator moved to
            # the looser `ptrace` profile (names stay private: /health needs no key).
            "seccomp": iso.seccomp,
            "seccompPtraceAgents": len(services.settings.sandbox_ptrace_agents) if iso.seccomp != "none" else 0,
            "sandboxUserNamespaces": iso.sandbox_user_namespaces,
            "network": iso.network,
            "diskQuota": iso.disk_quota,
        }
    return ok(body)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    services.metrics.refresh(
        uptime=services.uptime(), active_sessions=await active_sessions(services), pool=pool_stats(services),
        data_space=services.data_space.measure() if services.data_space is not None else None,
    )
    # aiohttp refuses a charset inside content_type=, so the exact header is set directly (measured Q8).
    return web.Response(body=services.metrics.render(), headers={"Content-Type": CONTENT_TYPE})
