"""GET /health and GET /metrics (no authentication)."""

from __future__ import annotations

from aiohttp import web

from ashd import __version__
from ashd.components import Components
from ashd.config import Settings
from ashd.http._json import ok
from ashd.http._keys import COMPONENTS
from ashd.metrics import CONTENT_TYPE
from ashd.storage import Database, QueueItems, Runners, is_alive, service_counts, utcnow

routes = web.RouteTableDef()


async def runner_counts(components: Components) -> dict[str, int]:
    return await Runners(components.db).counts(components.settings.runner_liveness_seconds)


async def configuration_warnings(settings: Settings, db: Database) -> list[str]:
    """Configuration an operator should fix, logged at start (`ashd.app`)."""
    return warnings_for(settings, (await service_counts(db)).other_tenants)


def warnings_for(settings: Settings, other_tenants: bool) -> list[str]:
    """The same, from what /health read already (`service_counts`)."""
    from ashd.storage import roots_warning

    found = roots_warning(bool(settings.agent_root_paths), other_tenants)
    return [found] if found else []


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    stats = components.pool_stats()
    counts = await service_counts(components.db)
    body: dict[str, object] = {
        "status": "ok",
        "version": __version__,
        "coordinatorId": components.coordinator_id,
        "activeSessions": counts.active_sessions,
        "activeSandboxes": sum(stats.get(s, 0) for s in ("warming", "warm", "waiting", "running")),
        "uptime": components.uptime(),
        "pool": dict(stats),
        "mode": components.settings.mode,
        "warnings": warnings_for(components.settings, counts.other_tenants),
    }
    if components.settings.mode == "coordinator":
        # Alive runners: registered, not swept dead, heartbeat within SERVICE_RUNNER_LIVENESS_SECONDS.
        body["remoteRunners"] = (await runner_counts(components))["alive"]
    space = components.data_space
    body["dataDir"] = space.measure().to_json(space.min_free, space.warn_free)
    iso = components.isolation
    if iso is not None:
        body["isolation"] = {
            "bwrap": iso.bwrap, "cgroups": iso.cgroups, "weak": iso.weak, "detail": iso.detail,
            # The profile in force for every sandbox, and how many agents the operator moved to
            # the looser `ptrace` profile (names stay private: /health needs no key).
            "seccomp": iso.seccomp,
            "seccompPtraceAgents": len(components.settings.sandbox_ptrace_agents) if iso.seccomp != "none" else 0,
            "sandboxUserNamespaces": iso.sandbox_user_namespaces,
            "network": iso.network,
            "diskQuota": iso.disk_quota,
        }
    return ok(body)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    components.metrics.refresh(
        uptime=components.uptime(), active_sessions=(await service_counts(components.db)).active_sessions,
        pool=components.pool_stats(),
        data_space=components.data_space.measure(),
    )
    if components.settings.mode == "coordinator":
        await _refresh_runner_series(components)
    queue = components.queue
    components.metrics.refresh_queue(await QueueItems(components.db).stats(None),
                                     await queue.running() if queue is not None else 0)
    # aiohttp refuses a charset inside content_type=, so the exact header is set directly (measured Q8).
    return web.Response(body=components.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _refresh_runner_series(components: Components) -> None:
    """Runner series from the shared database: every coordinator reports the same runners."""
    liveness = components.settings.runner_liveness_seconds
    rows = await Runners(components.db).rows()
    now = utcnow()
    live = [(r.id, r.max_sandboxes, r.running_count, r.warming_count) for r in rows if is_alive(r, now, liveness)]
    components.metrics.refresh_runners(await runner_counts(components), live)
