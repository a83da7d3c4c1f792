"""Authentication: API keys for /api/*, the internal secret for /api/internal/*, rate limits.

Verified keys are cached for a few seconds (`_key_cache.py`) so a request does not pay a database
round trip; a key deleted on this server stops working at once, one deleted through another
coordinator within the cache's lifetime. A key's `lastUsedAt` is written when it is verified against
the database, so it is exact to that lifetime at a cost of at most one write per key and period.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from ashd.errors import RateLimited, StorageError, Unauthorized
from ashd.http._keys import COMPONENTS, KEY_CACHE, KEY_ID, RATE_LIMITER, TENANT
from ashd.http._ratelimit import RateLimiter

PUBLIC_PATHS = frozenset({"/health", "/metrics", "/docs", "/openapi.json"})
PUBLIC_PREFIXES = ("/docs/",)
log = logging.getLogger(__name__)


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization")
    if header is None:
        raise Unauthorized("Missing Authorization header")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Invalid Authorization header format")
    return token


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or not path.startswith("/api/")


async def authenticate(request: web.Request) -> None:
    """Check the request's credentials and rate, and note its tenant and key on it (ApiErrors otherwise)."""
    path = request.path
    if is_public(path):
        return
    components = request.app[COMPONENTS]
    if path.startswith("/api/internal/"):
        # Always required: the server has a secret even when SERVICE_INTERNAL_SECRET is unset
        # (generated into the data dir at first start), so these endpoints are never open.
        secret = components.internal_secret
        token = bearer(request)
        if not secret or not hmac.compare_digest(token.encode(), secret.encode()):
            raise Unauthorized("Invalid internal secret")
        return
    token = bearer(request)
    cache = request.app[KEY_CACHE]
    identity = cache.get(token)
    if identity is None:
        identity = await components.api_keys.verify(token)
        if identity is None:
            raise Unauthorized("Invalid API key")
        cache.put(token, identity)
        try:
            await components.api_keys.touch(identity.key_id)
        # A full disk must not refuse requests over a timestamp. The database maps its own
        # "disk full" to StorageFull (a StorageError, not a SQLAlchemyError): caught too.
        except (SQLAlchemyError, OSError, StorageError) as exc:
            log.warning("could not record the API key's last use", extra={"keyId": identity.key_id,
                                                                          "error": str(exc)})
    limiter = request.app[RATE_LIMITER]
    wait = limiter.take(identity.key_id)
    if wait > 0:
        raise RateLimited(
            f"Rate limit exceeded for this API key ({limiter.rate:g} requests/s, burst {limiter.burst:g}); "
            f"retry after {RateLimiter.retry_after(wait)} s",
            headers={"Retry-After": RateLimiter.retry_after(wait)},
        )
    request[TENANT] = identity.tenant_id
    request[KEY_ID] = identity.key_id
