"""Builds the aiohttp application: middlewares, routes, state under typed keys."""

from __future__ import annotations

import importlib

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ashd.actors import Activity
from ashd.components import Components
from ashd.http._auth import authenticate
from ashd.http._errors import error_response
from ashd.http._key_cache import KeyCache
from ashd.http._keys import COMPONENTS, KEY_CACHE, RATE_LIMITER
from ashd.http._ratelimit import RateLimiter
from ashd.http._storage_guard import guard_storage
from ashd.http._strict import check_api_query

# Route modules register themselves here; each exposes a `routes` RouteTableDef.
ROUTE_MODULES: list[str] = [
    "ashd.http._health",
    "ashd.http._apikeys",
    "ashd.http._agents",
    "ashd.http._credentials",
    "ashd.http._sessions",
    "ashd.http._session_stream",
    "ashd.http._session_config",
    "ashd.http._session_files",
    "ashd.http._session_exec",
    "ashd.http._session_fork",
    "ashd.http._session_workspace",
    "ashd.http._attachments",
    "ashd.http._model_calls",
    "ashd.http._usage",
    "ashd.http._queue",
    "ashd.http._storage",
    "ashd.http._webhooks",
    "ashd.http._internal",
    "ashd.http._docs",
]


def api_middleware(activity: Activity | None) -> Middleware:
    """What every request goes through, in order: counted in flight (`activity`: this process runs
    sessions, and its pool's background work waits for quiet moments), authenticated, its query
    checked, refused while the data disk is below its reserve when it adds data; any failure
    answered as an ApiError. One middleware that calls each step, not a middleware per step: each
    layer is a coroutine of aiohttp's own around the next, on every request."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if activity is not None:
            activity.begin()
        try:
            await authenticate(request)
            check_api_query(request)
            guard_storage(request)
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, as an ApiError
            return error_response(request, exc)
        finally:
            if activity is not None:
                activity.end()

    return middleware


def build_app(components: Components) -> web.Application:
    settings = components.settings
    activity = components.local.activity if components.local is not None else None
    app = web.Application(middlewares=[api_middleware(activity)], client_max_size=settings.max_body_bytes)
    app[COMPONENTS] = components
    app[KEY_CACHE] = KeyCache()
    app[RATE_LIMITER] = RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst)
    for name in ROUTE_MODULES:
        app.add_routes(importlib.import_module(name).routes)
    return app
