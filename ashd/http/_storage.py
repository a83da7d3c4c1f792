"""GET /api/storage: what the caller's tenant holds on the server, and the limits it runs under."""

from __future__ import annotations

from aiohttp import web

from ashd.http._json import ok, tenant
from ashd.http._keys import COMPONENTS

routes = web.RouteTableDef()


@routes.get("/api/storage")
async def storage(request: web.Request) -> web.Response:
    store = request.app[COMPONENTS].tenant_storage
    ten = tenant(request)
    return ok({"storage": store.to_json(ten, await store.holdings(ten))})
