"""POST /api/sessions/{id}/messages (a turn, as SSE) and GET /api/sessions/{id}/stream (replay)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from aiohttp import web

from ashd.actors._session_deps import TurnTicket
from ashd.actors._turn import TurnLimitReached, TurnLimits, TurnRecorder, retrying
from ashd.errors import BadRequest, SandboxError, StorageError
from ashd.http._json import body_object, opt_str, tenant
from ashd.http._keys import SERVICES
from ashd.http._model_turn import ModelTurn
from ashd.http._sse import SseSink
from ashd.logs import emit_line
from ashd.sandboxing._meter import LimitNotice
from ashd.sandboxing._model_budget import TurnSummary
from ashd.services import Services
from ashd.storage._models import iso, utcnow

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
MAX_CONTENT_CHARS = 500_000
_TURNS: set[asyncio.Task[Any]] = set()  # running turns, referenced until they finish


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
    services = request.app[SERVICES]
    if services.sessions is None:
        raise SandboxError("sessions are not available on this server")
    body = await body_object(request)
    content = _content(body)
    model = opt_str(body, "model", max_len=255)
    partial = body.get("includePartialMessages", False)
    if not isinstance(partial, bool):
        raise BadRequest("`includePartialMessages` must be a boolean")
    budget = _budget(body)
    await services.tenant_storage.require_room(tenant(request), "a new message")
    t0 = time.monotonic()
    ticket = await services.sessions.begin_turn(tenant(request), request.match_info["id"], content, model)
    lookup_ms = (time.monotonic() - t0) * 1000
    # The turn runs in its own task: a client that goes away (the server may cancel the handler
    # then) must not stop it; it finishes and is stored, and the client can replay it.
    turn = asyncio.get_running_loop().create_task(
        _drive(services, ticket, content, partial, request, lookup_ms, budget))
    _TURNS.add(turn)
    turn.add_done_callback(_TURNS.discard)
    sink: SseSink = await asyncio.shield(turn)
    return sink.response


async def _drive(services: Services, ticket: TurnTicket, content: Any, partial: bool, request: web.Request,
                 lookup_ms: float, budget: float | None = None) -> SseSink:
    try:
        sink = await SseSink.open(request)
        await run_turn(services, ticket, content, partial, sink, lookup_ms, budget)
        await sink.close()
        return sink
    finally:
        services.sessions.end_turn(ticket)


async def run_turn(services: Services, ticket: TurnTicket, content: Any, partial: bool, sink: SseSink,
                   lookup_ms: float, budget_usd: float | None = None) -> None:
    """Drive one turn to the end whatever the client does; stored before `done` is sent."""
    recorder = TurnRecorder(services.sessions.deps.sessions, ticket.session_id, ticket.tenant,
                            turn_limits(services))
    first_event_ms: float | None = None
    count = 0
    stopped = False  # past a storage bound: the bridge winds the query down, nothing more is kept

    async def limits_check() -> list[dict[str, Any]]:
        nonlocal count, stopped
        if stopped:
            return []
        try:
            notices = await _report_limits(services, ticket, recorder, sink)
        except TurnLimitReached as exc:
            stopped = True
            await _stop_turn(ticket, recorder, sink, exc)
            return []
        count += sum(1 for n in notices if n.new)
        return [n.to_json() for n in notices]

    model_turn = ModelTurn(services.sessions.deps.model_proxy, ticket, budget_usd)
    try:
        async for frame in ticket.connection.query(content, model=ticket.model, include_partial_messages=partial,
                                                   query_id=ticket.query_id, on_limits_check=limits_check):
            kind = frame.get("type")
            if first_event_ms is None:
                first_event_ms = (time.monotonic() - ticket.started) * 1000
            if kind == "done":
                break
            if stopped:
                continue
            if kind == "message":
                data = frame.get("data")
                if not isinstance(data, dict):
                    continue
                raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
                try:
                    seq = await recorder.message(data, raw)
                except (TurnLimitReached, StorageError) as exc:
                    stopped = True
                    await _stop_turn(ticket, recorder, sink, exc)
                    continue
                count += 1
                await sink.send("message", raw, seq)
            elif kind == "error":
                count += 1
                try:
                    await _send_error(recorder, sink, str(frame.get("error") or "agent error"), counted=True)
                except TurnLimitReached as exc:
                    stopped = True
                    await _stop_turn(ticket, recorder, sink, exc)
        # Limits hit outside a tool call (an MCP server, a background process) are told at the end.
        await limits_check()
    except (SandboxError, OSError) as exc:
        reason = await _sandbox_failure(services, ticket, exc)
        await _send_error(recorder, sink, reason)
    except asyncio.CancelledError:
        await asyncio.shield(_finish(services, ticket, recorder, sink, model_turn))
        raise
    finally:
        model_turn.end()  # the model may no longer be called, also when something above failed
    model = await _finish(services, ticket, recorder, sink, model_turn)
    if services.settings.debug_timing:
        emit_line({"type": "timing", "source": "server", "sessionId": ticket.session_id,
                   "sandboxId": ticket.sandbox_id, "lookupMs": round(lookup_ms, 3),
                   "firstEventMs": round(first_event_ms or 0.0, 3),
                   "totalMs": round((time.monotonic() - ticket.started) * 1000, 3), "eventCount": count,
                   "modelMs": round(model.model_ms, 3), "modelCalls": model.calls,
                   "timestamp": iso(utcnow())})


def turn_limits(services: Services) -> TurnLimits:
    s = services.settings
    return TurnLimits(s.turn_max_stored_mb * 1024 * 1024, s.turn_max_events, s.storage_retry_seconds)


async def _send_error(recorder: TurnRecorder, sink: SseSink, message: str, *, counted: bool = False,
                      limit: str | None = None) -> None:
    """An `error` frame, stored with its id; without an id when storage is failing (it is not stored)."""
    try:
        seq, raw = await recorder.error(message, counted=counted, limit=limit)
    except StorageError:
        data = {"error": message} if limit is None else {"error": message, "limit": limit}
        await sink.send("error", json.dumps(data))
        return
    await sink.send("error", raw, seq)


async def _stop_turn(ticket: TurnTicket, recorder: TurnRecorder, sink: SseSink, exc: Exception) -> None:
    """A storage bound was reached (or storage failed for a whole retry window): say so, stop the
    agent, and let the loop drain what the bridge still sends without keeping it."""
    if isinstance(exc, TurnLimitReached):
        message = exc.message
    else:
        message = (f"This turn was stopped: {exc.message if isinstance(exc, StorageError) else exc}. The frames "
                   "shown after the last stored id are not in the session's history")
    await _send_error(recorder, sink, message)
    with contextlib.suppress(SandboxError):
        await ticket.connection.interrupt(ticket.query_id)


async def _finish(services: Services, ticket: TurnTicket, recorder: TurnRecorder, sink: SseSink,
                  model_turn: ModelTurn) -> TurnSummary:
    model = await model_turn.finish()  # the model calls' records are stored before `done`
    done = await recorder.done()
    if done.unstored:
        first, last = min(done.unstored), max(done.unstored)
        await sink.send("error", json.dumps({"error": (
            f"The server's data disk is full (or its database unreachable): {len(done.unstored)} frames of this "
            f"turn (ids {first}-{last}) reached you but could not be stored within "
            f"{services.settings.storage_retry_seconds:g} s. They are missing from the session's history and "
            "will not be replayed; nothing stored before was lost. Send the message again once space is freed")}))
    await _record_usage(services, ticket, recorder, stored=not done.unstored)
    await sink.send("done", done.raw, done.sequence)
    return model


async def _report_limits(services: Services, ticket: TurnTicket, recorder: TurnRecorder,
                         sink: SseSink) -> list[LimitNotice]:
    """The limits the sandbox hit, read on the host (cgroup counters, the disk's fill), never taken
    from the bridge: each new one becomes an `error` frame and event, counted against the turn's
    bounds (a sandbox can hit its limits on purpose, as often as it likes). The bridge's
    `limits_check` gets them all, for the tool result the model reads."""
    notices: list[LimitNotice] = await asyncio.to_thread(ticket.meter.check) if ticket.meter is not None else []
    for notice in (n for n in notices if n.new):
        log.warning("sandbox limit hit: %s", notice.message,
                    extra={"sessionId": ticket.session_id, "sandboxId": ticket.sandbox_id, "limit": notice.limit})
        services.metrics.count_limit_hit(notice.limit)
        await _send_error(recorder, sink, notice.message, counted=True, limit=notice.limit)
    return notices


async def _sandbox_failure(services: Services, ticket: TurnTicket, exc: Exception) -> str:
    pool = getattr(services.pool, "proxy", None)
    if pool is not None:
        from ashd.actors._aio import call

        info = None
        for _ in range(20):  # the process may need a moment to be reaped after the socket closed
            info = await call(pool.exit_info(ticket.sandbox_id), services.settings.actor_timeout_seconds)
            if info is not None:
                break
            await asyncio.sleep(0.05)
        if info is not None:
            return f"sandbox crashed: {info.describe()}"
    return f"sandbox connection lost: {exc}"


async def _record_usage(services: Services, ticket: TurnTicket, recorder: TurnRecorder, *, stored: bool) -> None:
    # Token usage is not taken from the turn: the sandbox could report anything. The model proxy
    # records what the model API reported for every call (ModelTurn.finish stored it).
    values = {
        "tool_calls": float(recorder.tool_calls),
        "message": 1.0,
        "compute_seconds": ticket.compute_seconds(),
    }
    window = services.settings.storage_retry_seconds if stored else 0.0
    try:
        await retrying(lambda: services.sessions.deps.record_usage(ticket.tenant, ticket.session_id,
                                                                   ticket.agent_name, values),
                       window, "recording usage", ticket.session_id)
    except StorageError:
        # The values go to the log so that the operator can still account for the turn.
        log.error("usage of a turn could not be stored", extra={"sessionId": ticket.session_id,
                                                                "tenant": ticket.tenant, "usage": values})


@routes.get("/api/sessions/{id}/stream")
async def replay(request: web.Request) -> web.StreamResponse:
    """Frames after Last-Event-ID (or ?after=N) from storage, then live until the turn ends."""
    services = request.app[SERVICES]
    session_id = request.match_info["id"]
    ten = tenant(request)
    await services.sessions.deps.sessions.get(ten, session_id)  # 404 for unknown or other tenant
    raw_after = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw_after)
    except ValueError as exc:
        raise BadRequest("Last-Event-ID / `after` must be an integer event id") from exc
    store = services.sessions.deps.sessions
    sink = await SseSink.open(request)
    idle_rounds = 0
    while sink.alive:
        frames = await store.frames_after(session_id, after)
        for frame in frames:
            if not await sink.send(frame.event, frame.data, frame.sequence):
                break
            after = frame.sequence
        if frames:
            idle_rounds = 0
            continue
        running = await services.sessions.running_turn(ten, session_id)
        if running is None:
            idle_rounds += 1
            if idle_rounds > 1:  # nothing running and nothing new after a last look: done
                break
        # Followers poll storage, which the running turn writes in small batches.
        await asyncio.sleep(0.05)
    await sink.close()
    return sink.response
