"""Builds the aiohttp application: middlewares, routes, state under typed keys."""

from __future__ import annotations

import importlib

from aiohttp import web
from aiohttp.typedefs import Middleware

from ashd.components import Components
from ashd.http._activity import activity_middleware
from ashd.http._auth import auth_middleware
from ashd.http._errors import error_middleware
from ashd.http._key_cache import KeyCache
from ashd.http._keys import COMPONENTS, KEY_CACHE, RATE_LIMITER
from ashd.http._ratelimit import RateLimiter
from ashd.http._storage_guard import storage_guard_middleware
from ashd.http._strict import strict_query_middleware

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


def build_app(components: Components) -> web.Application:
    settings = components.settings
    middlewares: list[Middleware] = [error_middleware, auth_middleware, strict_query_middleware,
                                     storage_guard_middleware]
    if components.local is not None:  # this process runs sessions: its pool waits for quiet moments
        middlewares.insert(0, activity_middleware(components.local.activity))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[COMPONENTS] = components
    app[KEY_CACHE] = KeyCache()
    app[RATE_LIMITER] = RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst)
    for name in ROUTE_MODULES:
        app.add_routes(importlib.import_module(name).routes)
    return app
