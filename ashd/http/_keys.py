"""Typed application-state keys (aiohttp AppKey): no globals, no string keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from ashd.backends import SessionBackend
    from ashd.components import Components
    from ashd.http._key_cache import KeyCache
    from ashd.http._ratelimit import RateLimiter

COMPONENTS: web.AppKey[Components] = web.AppKey("components")
# The HTTP layer's own state, made by `build_app`.
KEY_CACHE: web.AppKey[KeyCache] = web.AppKey("key_cache")
RATE_LIMITER: web.AppKey[RateLimiter] = web.AppKey("rate_limiter")

# Per-request values set by the auth middleware.
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
KEY_ID: web.RequestKey[str] = web.RequestKey("key_id", str)


def backend(request: web.Request) -> SessionBackend:
    """Where this server's sessions run."""
    return request.app[COMPONENTS].sessions
