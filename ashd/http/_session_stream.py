"""POST /api/sessions/{id}/messages (a turn, as SSE) and GET /api/sessions/{id}/stream (replay)."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from ashd.backends import Message, check_attachment_ids
from ashd.errors import BadRequest, ServiceError
from ashd.http._json import body_object, opt_str, tenant
from ashd.http._keys import COMPONENTS, backend
from ashd.http._message_options import query_options
from ashd.http._sse import SseSink

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
MAX_CONTENT_CHARS = 500_000


def _content(body: dict[str, Any]) -> Any:
    content = body.get("content")
    if isinstance(content, str):
        if not content.strip():
            raise BadRequest("`content` is required")
        if len(content) > MAX_CONTENT_CHARS:
            raise BadRequest(f"`content` is longer than {MAX_CONTENT_CHARS} characters")
        return content
    if isinstance(content, list) and content and all(isinstance(b, dict) and "type" in b for b in content):
        if len(json.dumps(content)) > MAX_CONTENT_CHARS * 2:
            raise BadRequest("`content` is too large")
        return content
    raise BadRequest("`content` is required: a string or a list of content blocks")


def _budget(body: dict[str, Any]) -> float | None:
    """`maxBudgetUsd`: the most this message's model calls may cost (enforced by the model proxy)."""
    value = body.get("maxBudgetUsd")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise BadRequest("`maxBudgetUsd` must be a number > 0 (USD)")
    return float(value)


@routes.post("/api/sessions/{id}/messages")
async def send_message(request: web.Request) -> web.StreamResponse:
    sessions = backend(request)
    body = await body_object(request)
    content = _content(body)
    model = opt_str(body, "model", max_len=255)
    partial = body.get("includePartialMessages", False)
    if not isinstance(partial, bool):
        raise BadRequest("`includePartialMessages` must be a boolean")
    budget = _budget(body)
    attachments = check_attachment_ids(body.get("attachments"))
    components = request.app[COMPONENTS]
    options = query_options(body, components.settings.model_max_tokens)
    await components.tenant_storage.require_room(tenant(request), "a new message")
    turn = await sessions.message(tenant(request), request.match_info["id"],
                                  Message(content, model, partial, budget, options=options,
                                          attachments=attachments))
    # A client that goes away only ends its own stream: the turn runs on and is stored (replayable).
    try:
        sink = await SseSink.open(request)
        try:
            async for frame in turn:
                if not await sink.send(frame.event, frame.data, frame.id):
                    break
        except ServiceError as exc:
            # Where the turn runs was lost mid-stream (a runner gone): a connection-level failure, not
            # a frame. The connection is cut so the client reconnects (Last-Event-ID) at once.
            log.warning("turn stream lost: %s", exc.message, extra={"sessionId": request.match_info["id"]})
            if request.transport is not None:
                request.transport.abort()
            return sink.response
        await sink.close()
    finally:
        turn.detach()
    return sink.response


@routes.get("/api/sessions/{id}/stream")
async def replay(request: web.Request) -> web.StreamResponse:
    """Frames after Last-Event-ID (or ?after=N) from storage, then live until the turn ends."""
    raw_after = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw_after)
    except ValueError as exc:
        raise BadRequest("Last-Event-ID / `after` must be an integer event id") from exc
    frames = await backend(request).replay(tenant(request), request.match_info["id"], after)
    async with contextlib.aclosing(frames):
        sink = await SseSink.open(request)
        async for frame in frames:
            if not await sink.send(frame.event, frame.data, frame.id):
                break
    await sink.close()
    return sink.response
