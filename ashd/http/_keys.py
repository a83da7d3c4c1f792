"""Typed application-state keys (aiohttp AppKey): no globals, no string keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ashd.errors import SandboxError

if TYPE_CHECKING:
    from ashd.backends import SessionBackend
    from ashd.services import Services

SERVICES: web.AppKey[Services] = web.AppKey("services")

# Per-request values set by the auth middleware.
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
KEY_ID: web.RequestKey[str] = web.RequestKey("key_id", str)


def backend(request: web.Request) -> SessionBackend:
    """Where this server's sessions run; 503 on a server that runs none."""
    found = request.app[SERVICES].backend
    if found is None:
        raise SandboxError("sessions are not available on this server")
    return found
