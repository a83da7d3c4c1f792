"""The queue: prompts to run later as turns, by priority then age (docs/queue.md)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ashd.errors import BadRequest, NotFound, QuotaExceeded
from ashd.http._json import body_object, ok, opt_str, query_int, req_str, tenant
from ashd.http._keys import COMPONENTS
from ashd.storage import QUEUE_STATUSES, QueueItems, Sessions

routes = web.RouteTableDef()
MAX_PROMPT_CHARS = 500_000
MAX_PRIORITY = 1_000_000
MAX_RETRIES = 100


def _items(request: web.Request) -> QueueItems:
    return QueueItems(request.app[COMPONENTS].db)


def _int(body: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"`{key}` must be an integer from {lo} to {hi}")
    return value


@routes.post("/api/queue")
async def add_item(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    body = await body_object(request)
    ten = tenant(request)
    agent_name = req_str(body, "agentName", max_len=255)
    prompt = req_str(body, "prompt", max_len=MAX_PROMPT_CHARS)
    session_id = opt_str(body, "sessionId", max_len=64)
    priority = _int(body, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY)
    max_retries = _int(body, "maxRetries", 3, 0, MAX_RETRIES)
    # An unknown agent or session (or another tenant's) is a 400 here, as the published client expects
    # of this operation: what is wrong is a field of the body.
    try:
        await components.agents.resolve(ten, agent_name)
    except NotFound as exc:
        raise BadRequest(f"{exc.message}: deploy it first, or fix `agentName`") from exc
    if session_id is not None:
        try:
            session = await Sessions(components.db).get(ten, session_id)
        except NotFound as exc:
            raise BadRequest(f"{exc.message}: fix `sessionId`, or leave it out to run in a new session") from exc
        if session.agent_name != agent_name:
            raise BadRequest(f"session {session_id} runs agent {session.agent_name}, not {agent_name}: send its "
                             "agent's name, or leave `sessionId` out to run the prompt in a new session")
        if session.status == "ended":
            raise BadRequest(f"session {session_id} has ended; leave `sessionId` out to run the prompt in a new "
                             "session")
    await components.tenant_storage.require_room(ten, "a queued prompt")
    limit = components.settings.tenant_max_queued
    if limit and (waiting := await _items(request).open_count(ten)) >= limit:
        raise QuotaExceeded(f"Limit reached: this tenant has {waiting} queue items pending or processing, the most "
                            "it may have (SERVICE_TENANT_MAX_QUEUED); wait for some to finish or cancel some")
    item = await _items(request).add(ten, agent_name, prompt, session_id, priority, max_retries)
    if components.queue is not None:
        components.queue.kick()
    return ok({"item": item}, status=201, headers={"Location": f"/api/queue/{item['id']}"})


@routes.get("/api/queue")
async def list_items(request: web.Request) -> web.Response:
    status = request.query.get("status") or None
    if status is not None and status not in QUEUE_STATUSES:
        raise BadRequest(f"query `status` must be one of {', '.join(QUEUE_STATUSES)}")
    limit = query_int(request, "limit", 50, 1, 1000)
    return ok({"items": await _items(request).listing(tenant(request), status, limit)})


@routes.get("/api/queue/stats")
async def queue_stats(request: web.Request) -> web.Response:
    return ok({"stats": await _items(request).stats(tenant(request))})


@routes.get("/api/queue/{id}")
async def get_item(request: web.Request) -> web.Response:
    return ok({"item": await _items(request).get(tenant(request), request.match_info["id"])})


@routes.delete("/api/queue/{id}")
async def cancel_item(request: web.Request) -> web.Response:
    return ok({"item": await _items(request).cancel(tenant(request), request.match_info["id"])})
