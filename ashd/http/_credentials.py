"""Credentials: store (encrypted), list, get, delete. The secret is never returned."""

from __future__ import annotations

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._json import body_object, ok, opt_str, tenant
from ashd.http._keys import COMPONENTS
from ashd.storage import Credentials

routes = web.RouteTableDef()


def _credentials(request: web.Request) -> Credentials:
    return request.app[COMPONENTS].credentials


@routes.post("/api/credentials")
async def create_credential(request: web.Request) -> web.Response:
    body = await body_object(request)
    if "key" not in body:
        raise BadRequest("`key` is required")
    await request.app[COMPONENTS].tenant_storage.require_count_below(tenant(request), "credentials")
    record = await _credentials(request).create(
        tenant(request), body.get("type"), body["key"], opt_str(body, "label", max_len=255)
    )
    return ok({"credential": record.to_json()}, status=201)


@routes.get("/api/credentials")
async def list_credentials(request: web.Request) -> web.Response:
    records = await _credentials(request).list(tenant(request))
    return ok({"credentials": [r.to_json() for r in records]})


@routes.get("/api/credentials/{id}")
async def get_credential(request: web.Request) -> web.Response:
    record = await _credentials(request).get(tenant(request), request.match_info["id"])
    return ok({"credential": record.to_json()})


@routes.delete("/api/credentials/{id}")
async def delete_credential(request: web.Request) -> web.Response:
    await _credentials(request).delete(tenant(request), request.match_info["id"])
    return web.Response(status=204)
