"""Webhooks of the caller's tenant: register, list, change, delete, see deliveries, send a test.

The address rules (ashd.sandboxing WebhookTargets) are checked here at registration and on every
change of `url`, and again by the dispatcher at each delivery. Another tenant's hook is a 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ashd.errors import BadRequest, Conflict
from ashd.http._json import body_object, ok, opt_str, opt_str_list, query_int, req_str, tenant
from ashd.http._keys import COMPONENTS
from ashd.sandboxing import split_url
from ashd.storage import WEBHOOK_EVENTS, Webhooks, delivery_json, webhook_json

routes = web.RouteTableDef()
MAX_URL = 2048


def _store(request: web.Request) -> Webhooks:
    return request.app[COMPONENTS].webhooks.store


async def _url(request: web.Request, value: str) -> str:
    if len(value) > MAX_URL:
        raise BadRequest(f"`url` is longer than {MAX_URL} characters")
    split_url(value)
    await request.app[COMPONENTS].webhooks.targets.check_url(value)
    return value


def _events(value: list[str] | None) -> list[str]:
    if not value:
        raise BadRequest(f"`events` must name at least one event: {', '.join(WEBHOOK_EVENTS)}")
    unknown = [e for e in value if e not in WEBHOOK_EVENTS]
    if unknown:
        raise BadRequest(f"unknown event `{unknown[0]}` in `events`; known events: {', '.join(WEBHOOK_EVENTS)}")
    return list(dict.fromkeys(value))


def _enabled(body: dict[str, Any]) -> bool | None:
    value = body.get("enabled")
    if value is not None and not isinstance(value, bool):
        raise BadRequest("`enabled` must be true or false")
    return value


@routes.post("/api/webhooks")
async def create_webhook(request: web.Request) -> web.Response:
    body = await body_object(request)
    url = await _url(request, req_str(body, "url", max_len=MAX_URL))
    if "events" not in body:
        raise BadRequest(f"`events` is required: a list of {', '.join(WEBHOOK_EVENTS)}")
    events = _events(opt_str_list(body, "events"))
    description = opt_str(body, "description", max_len=1000)
    enabled = _enabled(body)
    store = _store(request)
    row, secret = await store.create(tenant(request), url, events, description)
    if enabled is False:
        row = await store.update(tenant(request), row.id, enabled=False)
    return ok({"webhook": webhook_json(row), "secret": secret}, status=201)


@routes.get("/api/webhooks")
async def list_webhooks(request: web.Request) -> web.Response:
    return ok({"webhooks": [webhook_json(r) for r in await _store(request).list(tenant(request))]})


@routes.get("/api/webhooks/{webhook_id}")
async def get_webhook(request: web.Request) -> web.Response:
    row = await _store(request).get(tenant(request), request.match_info["webhook_id"])
    return ok({"webhook": webhook_json(row)})


@routes.patch("/api/webhooks/{webhook_id}")
async def patch_webhook(request: web.Request) -> web.Response:
    webhook_id = request.match_info["webhook_id"]
    store = _store(request)
    await store.get(tenant(request), webhook_id)  # 404 before a 400 about the body
    body = await body_object(request)
    values: dict[str, Any] = {}
    if body.get("url") is not None:
        values["url"] = await _url(request, req_str(body, "url", max_len=MAX_URL))
    if body.get("events") is not None:
        values["events"] = _events(opt_str_list(body, "events"))
    if "description" in body:
        values["description"] = opt_str(body, "description", max_len=1000)
    enabled = _enabled(body)
    if enabled is not None:
        values["enabled"] = enabled
    if not values:
        raise BadRequest("Nothing to change: send one or more of `url`, `events`, `description`, `enabled`")
    row = await store.update(tenant(request), webhook_id, **values)
    return ok({"webhook": webhook_json(row)})


@routes.delete("/api/webhooks/{webhook_id}")
async def delete_webhook(request: web.Request) -> web.Response:
    await _store(request).delete(tenant(request), request.match_info["webhook_id"])
    return web.Response(status=204)


@routes.get("/api/webhooks/{webhook_id}/deliveries")
async def list_deliveries(request: web.Request) -> web.Response:
    limit = query_int(request, "limit", 50, 1, 500)
    rows = await _store(request).deliveries(tenant(request), request.match_info["webhook_id"], limit)
    return ok({"deliveries": [delivery_json(r) for r in rows]})


@routes.post("/api/webhooks/{webhook_id}/test")
async def test_webhook(request: web.Request) -> web.Response:
    webhook_id = request.match_info["webhook_id"]
    if not (await _store(request).get(tenant(request), webhook_id)).enabled:
        raise Conflict("This webhook is disabled: enable it (PATCH `enabled: true`) to send it a test")
    delivery_id = await request.app[COMPONENTS].webhooks.test(tenant(request), webhook_id)
    return ok({"deliveryId": delivery_id}, status=202)
