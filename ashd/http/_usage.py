"""Usage events and their sums, scoped to the caller's tenant."""

from __future__ import annotations

from aiohttp import web

from ashd.http._json import ok, query_int, tenant
from ashd.http._keys import COMPONENTS
from ashd.storage import UsageFilter, list_usage, parse_time, usage_stats

routes = web.RouteTableDef()


def _filter(request: web.Request) -> UsageFilter:
    q = request.query
    return UsageFilter(
        session_id=q.get("sessionId") or None,
        agent_name=q.get("agentName") or None,
        after=parse_time(q.get("after"), "after"),
        before=parse_time(q.get("before"), "before"),
    )


@routes.get("/api/usage")
async def list_events(request: web.Request) -> web.Response:
    flt = _filter(request)
    limit = query_int(request, "limit", 100, 1, 1000)
    return ok({"events": await list_usage(request.app[COMPONENTS].db, tenant(request), flt, limit)})


@routes.get("/api/usage/stats")
async def stats(request: web.Request) -> web.Response:
    return ok({"stats": await usage_stats(request.app[COMPONENTS].db, tenant(request), _filter(request))})
