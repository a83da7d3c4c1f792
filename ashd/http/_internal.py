"""Internal runner endpoints (`/api/internal/*`, internal secret): register, heartbeat, deregister, list."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._json import body_object, ok, req_str
from ashd.http._keys import COMPONENTS
from ashd.storage import Runners

routes = web.RouteTableDef()


def _int(body: dict[str, Any], key: str, default: int | None = None, lo: int = 0, hi: int = 2**31) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"`{key}` must be an integer between {lo} and {hi}")
    return value


@routes.post("/api/internal/runners/register")
async def register(request: web.Request) -> web.Response:
    body = await body_object(request)
    await Runners(request.app[COMPONENTS].db).register(
        req_str(body, "runnerId", max_len=255), req_str(body, "host", max_len=255),
        _int(body, "port", None, 1, 65535), _int(body, "maxSandboxes", 0))
    return ok({"ok": True})


@routes.post("/api/internal/runners/heartbeat")
async def heartbeat(request: web.Request) -> web.Response:
    body = await body_object(request)
    stats = body.get("stats") or {}
    if not isinstance(stats, dict):
        raise BadRequest("`stats` must be a PoolStats object")
    for name in stats:
        _int(stats, name)  # counts: a list or a 70-bit number must not reach the database
    await Runners(request.app[COMPONENTS].db).heartbeat(req_str(body, "runnerId", max_len=255), stats,
                                                     _int(body, "activeCount", 0))
    return ok({"ok": True})


@routes.post("/api/internal/runners/deregister")
async def deregister(request: web.Request) -> web.Response:
    body = await body_object(request)
    paused = await Runners(request.app[COMPONENTS].db).deregister(req_str(body, "runnerId", max_len=255))
    return ok({"ok": True, "pausedSessions": len(paused)})


@routes.get("/api/internal/runners")
async def list_runners(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    runners = await Runners(components.db).list(components.settings.runner_liveness_seconds)
    return ok({"runners": runners, "count": len(runners), "hasLocal": components.local is not None})
