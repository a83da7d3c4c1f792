"""API keys of the caller's tenant, and key minting for operators (internal secret)."""

from __future__ import annotations

from aiohttp import web

from ashd.http._json import body_object, ok, opt_str, req_str, tenant
from ashd.http._keys import COMPONENTS, KEY_CACHE

routes = web.RouteTableDef()


@routes.get("/api/api-keys")
async def list_keys(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    return ok({"keys": await components.api_keys.list(tenant(request))})


@routes.post("/api/api-keys")
async def create_key(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    body = await body_object(request, allow_empty=True)
    await components.tenant_storage.require_count_below(tenant(request), "API keys")
    key_id, key = await components.api_keys.mint(tenant(request), opt_str(body, "label", max_len=255))
    return ok({"id": key_id, "key": key}, status=201)


@routes.delete("/api/api-keys/{key_id}")
async def delete_key(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    key_id = request.match_info["key_id"]
    await components.api_keys.delete(tenant(request), key_id)
    request.app[KEY_CACHE].forget(key_id)  # revoked on this server at once
    return ok({"ok": True})


@routes.post("/api/internal/api-keys")
async def mint_for_tenant(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    body = await body_object(request)
    tenant_id = req_str(body, "tenantId", max_len=255)
    key_id, key = await components.api_keys.mint(tenant_id, opt_str(body, "label", max_len=255), source="operator")
    return ok({"id": key_id, "key": key, "tenantId": tenant_id}, status=201)
