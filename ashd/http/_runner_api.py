"""The runner API (`ashd runner`): one endpoint per `SessionBackend` operation, for coordinators.

Every request carries `Authorization: Bearer <SERVICE_INTERNAL_SECRET>` (else 401), the tenant of the
session as a field (the coordinator checked the client's key), and gets the backend's answer as
JSON, or its ApiError. `messages` answers the turn as SSE with the public stream's rule (one frame in
flight); a coordinator that hangs up detaches the turn, which runs on and is stored. While the
runner drains (SIGTERM) it refuses new sessions and resumes with 503. Documented in docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ashd.actors import Activity
from ashd.backends import DRAINING_HEADER, FULL_HEADER, Message, NewSession, SessionBackend
from ashd.errors import BadRequest, CapacityError, Unauthorized, Unavailable
from ashd.http._activity import activity_middleware
from ashd.http._errors import error_middleware
from ashd.http._file_response import send_file
from ashd.http._json import body_object, ok, opt_str, req_str
from ashd.http._sse import CLIENT_READ_TIMEOUT, SseSink
from ashd.storage import AgentFile, check_relative_path


@dataclass
class RunnerApiState:
    backend: SessionBackend
    secret: str
    runner_id: str
    pool_stats: Callable[[], Mapping[str, int]]
    max_body_bytes: int
    draining: bool = False
    started: float = field(default=0.0)
    activity: Activity | None = None  # the runner's sessions' requests (see `Activity`)


STATE: web.AppKey[RunnerApiState] = web.AppKey("runner_state")
routes = web.RouteTableDef()
# The coordinator's own client decides first (its 30 s rule); this hop only catches a coordinator
# that stopped reading without hanging up.
_HOP_READ_TIMEOUT = CLIENT_READ_TIMEOUT + 15
_CHUNK = 256 * 1024


@web.middleware
async def secret_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path != "/health":
        state = request.app[STATE]
        header = request.headers.get("Authorization", "")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        if not token or not hmac.compare_digest(token.encode(), state.secret.encode()):
            raise Unauthorized("the runner API needs `Authorization: Bearer <SERVICE_INTERNAL_SECRET>` (the "
                               "coordinator's value)")
    return await handler(request)


def build_runner_app(state: RunnerApiState) -> web.Application:
    middlewares: list[Middleware] = [error_middleware, secret_middleware]
    if state.activity is not None:
        middlewares.insert(0, activity_middleware(state.activity))
    app = web.Application(middlewares=middlewares, client_max_size=state.max_body_bytes)
    app[STATE] = state
    app.add_routes(routes)
    return app


def _state(request: web.Request) -> RunnerApiState:
    return request.app[STATE]


def _sid(request: web.Request) -> str:
    return request.match_info["id"]


def _tenant_query(request: web.Request) -> str:
    tenant = request.query.get("tenant")
    if not tenant:
        raise BadRequest("query `tenant` is required")
    return tenant


def _refuse_while_draining(state: RunnerApiState, what: str) -> None:
    if state.draining:
        raise Unavailable(f"runner {state.runner_id} is shutting down and takes no {what}; try again (the "
                          "coordinator picks another runner)", headers={DRAINING_HEADER: "1", "Retry-After": "1"})


def _refuse_when_full(state: RunnerApiState) -> None:
    """Every sandbox runs a turn, and running ones are never evicted: a new session cannot start
    here. Refused before anything is stored, so the coordinator, whose copy of this runner's
    heartbeat may be a moment old, places it on the next best runner instead of failing it."""
    stats = state.pool_stats()
    capacity = stats.get("maxCapacity", 0)
    if capacity > 0 and stats.get("running", 0) >= capacity:
        raise CapacityError(f"Sandbox capacity reached on runner {state.runner_id} ({capacity} sandboxes, all "
                            "running turns); try again later, or add runners or raise SERVICE_MAX_SANDBOXES",
                            headers={FULL_HEADER: "1", "Retry-After": "1"})


def _bytes(body: dict[str, Any], key: str) -> bytes | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"`{key}` must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"`{key}` is not valid base64") from exc


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    state = _state(request)
    return ok({"status": "draining" if state.draining else "ok", "runnerId": state.runner_id,
               "pool": dict(state.pool_stats()), "runningTurns": await state.backend.running_turns()})


@routes.post("/runner/sessions")
async def create(request: web.Request) -> web.Response:
    state = _state(request)
    _refuse_while_draining(state, "new sessions")
    _refuse_when_full(state)
    body = await body_object(request)
    config = body.get("config") or {}
    if not isinstance(config, dict):
        raise BadRequest("`config` must be an object")
    new = NewSession(session_id=req_str(body, "sessionId", max_len=64), tenant=req_str(body, "tenant", max_len=255),
                     agent_name=req_str(body, "agentName", max_len=255), model=opt_str(body, "model", max_len=255),
                     config=config, credential_id=opt_str(body, "credentialId", max_len=64),
                     encrypted_env=_bytes(body, "encryptedEnv"))
    return ok({"session": await state.backend.create(new)}, status=201)


@routes.get("/runner/sessions/{id}")
async def view(request: web.Request) -> web.Response:
    return ok({"session": await _state(request).backend.view(_tenant_query(request), _sid(request))})


@routes.post("/runner/sessions/{id}/{action:resume|pause|stop}")
async def lifecycle(request: web.Request) -> web.Response:
    state, action = _state(request), request.match_info["action"]
    if action == "resume":
        _refuse_while_draining(state, "resumes")
    tenant = req_str(await body_object(request), "tenant", max_len=255)
    backend = state.backend
    call = {"resume": backend.resume, "pause": backend.pause, "stop": backend.stop}[action]
    return ok({"session": await call(tenant, _sid(request))})


@routes.post("/runner/sessions/{id}/end")
async def end(request: web.Request) -> web.Response:
    body = await body_object(request)
    purge = body.get("purge", False)
    if not isinstance(purge, bool):
        raise BadRequest("`purge` must be a boolean")
    session = await _state(request).backend.end(req_str(body, "tenant", max_len=255), _sid(request), purge=purge)
    return ok({"session": session})


@routes.patch("/runner/sessions/{id}/config")
async def configure(request: web.Request) -> web.Response:
    body = await body_object(request)
    changes = body.get("changes")
    if not isinstance(changes, dict):
        raise BadRequest("`changes` must be an object (checked by the coordinator)")
    session = await _state(request).backend.configure(req_str(body, "tenant", max_len=255), _sid(request), changes)
    return ok({"session": session})


@routes.post("/runner/sessions/{id}/interrupt")
async def interrupt(request: web.Request) -> web.Response:
    tenant = req_str(await body_object(request), "tenant", max_len=255)
    return ok(await _state(request).backend.interrupt(tenant, _sid(request)))


@routes.post("/runner/sessions/{id}/fork")
async def fork(request: web.Request) -> web.Response:
    state = _state(request)
    _refuse_while_draining(state, "new sessions")
    _refuse_when_full(state)
    body = await body_object(request)
    session = await state.backend.fork(req_str(body, "tenant", max_len=255), _sid(request),
                                       req_str(body, "childId", max_len=64), _bytes(body, "encryptedEnv"))
    return ok({"session": session}, status=201)


@routes.post("/runner/sessions/{id}/exec")
async def exec_(request: web.Request) -> web.Response:
    body = await body_object(request)
    argv = body.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise BadRequest("`argv` must be a non-empty array of strings")
    timeout = body.get("timeoutS")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise BadRequest("`timeoutS` must be a number > 0")
    return ok(await _state(request).backend.exec(req_str(body, "tenant", max_len=255), _sid(request), argv,
                                                 float(timeout)))


@routes.post("/runner/sessions/{id}/files")
async def write_files(request: web.Request) -> web.Response:
    body = await body_object(request)
    raw = body.get("files")
    if not isinstance(raw, list):
        raise BadRequest("`files` must be an array of {path, content (base64)}")
    files = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise BadRequest(f"`files[{i}]` must be an object with a string `path`")
        files.append(AgentFile(item["path"], _bytes(item, "content") or b""))
    paths = await _state(request).backend.write_files(req_str(body, "tenant", max_len=255), _sid(request),
                                                      opt_str(body, "target", max_len=4096) or ".", files)
    return ok({"paths": paths})


@routes.get("/runner/sessions/{id}/workspace")
async def bundle(request: web.Request) -> web.StreamResponse:
    found = await _state(request).backend.bundle(_tenant_query(request), _sid(request))
    try:
        resp = web.StreamResponse(headers={"Content-Type": "application/gzip", "Content-Length": str(found.size),
                                           "X-Service-Source": found.source})
        await resp.prepare(request)
        while chunk := await asyncio.to_thread(found.stream.read, _CHUNK):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        found.stream.close()


@routes.post("/runner/sessions/{id}/workspace")
async def restore_bundle(request: web.Request) -> web.Response:
    data = await request.read()
    restored, skipped = await _state(request).backend.restore_bundle(_tenant_query(request), _sid(request), data)
    return ok({"restored": restored, "skipped": skipped})


@routes.get("/runner/sessions/{id}/files")
async def list_files(request: web.Request) -> web.Response:
    files = await _state(request).backend.files(_tenant_query(request), _sid(request))
    try:
        entries = await asyncio.to_thread(files.reader.list_files)
    finally:
        files.reader.close()
    return ok({"files": [e.to_json() for e in entries], "source": files.source})


@routes.get("/runner/sessions/{id}/files/{path:.+}")
async def read_file(request: web.Request) -> web.StreamResponse:
    rel = request.match_info["path"]
    check_relative_path(rel)
    fmt = request.query.get("format", "raw")
    files = await _state(request).backend.files(_tenant_query(request), _sid(request))
    try:
        if fmt == "json":
            text = await asyncio.to_thread(files.reader.read_for_json, rel)
            return ok({"path": rel, "content": text, "source": files.source})
        stream, size = await asyncio.to_thread(files.reader.open_file, rel)
        return await send_file(request, stream, size, rel, {"X-Service-Source": files.source})
    finally:
        files.reader.close()


@routes.post("/runner/sessions/{id}/messages")
async def message(request: web.Request) -> web.StreamResponse:
    body = await body_object(request)
    partial = body.get("includePartialMessages", False)
    budget = body.get("maxBudgetUsd")
    if not isinstance(partial, bool):
        raise BadRequest("`includePartialMessages` must be a boolean")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)):
        raise BadRequest("`maxBudgetUsd` must be a number")
    content = body.get("content")
    if not isinstance(content, str | list):
        raise BadRequest("`content` must be a string or a list of content blocks")
    # The coordinator checked the options and the attachment ids (the public API's rules); the runner
    # hands them on as they came, as it does the content.
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise BadRequest("`options` must be an object")
    attachments = body.get("attachments") or []
    if not isinstance(attachments, list) or not all(isinstance(a, str) for a in attachments):
        raise BadRequest("`attachments` must be an array of attachment ids")
    turn = await _state(request).backend.message(
        req_str(body, "tenant", max_len=255), _sid(request),
        Message(content, opt_str(body, "model", max_len=255), partial, None if budget is None else float(budget),
                options=options, attachments=tuple(attachments)))
    # The coordinator hanging up ends only this stream: the turn runs on and is stored.
    try:
        sink = await SseSink.open(request, read_timeout=_HOP_READ_TIMEOUT)
        async for frame in turn:
            if not await sink.send(frame.event, frame.data, frame.id):
                break
        await sink.close()
    finally:
        turn.detach()
    return sink.response
