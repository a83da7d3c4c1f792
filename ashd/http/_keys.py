"""Typed application-state keys (aiohttp AppKey): no globals, no string keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from ashd.services import Services

SERVICES: web.AppKey[Services] = web.AppKey("services")

# Per-request values set by the auth middleware.
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
KEY_ID: web.RequestKey[str] = web.RequestKey("key_id", str)
