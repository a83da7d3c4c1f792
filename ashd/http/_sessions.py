"""Session lifecycle routes, message and event listing."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ashd.backends import NewSession
from ashd.errors import BadRequest, SandboxError, ServiceError
from ashd.http._json import (
    body_object,
    ok,
    opt_disk_mb,
    opt_str,
    opt_str_list,
    opt_str_map,
    query_int,
    req_str,
    tenant,
)
from ashd.http._keys import COMPONENTS, backend
from ashd.storage import SessionLogs, Sessions, new_id

routes = web.RouteTableDef()
PERMISSION_MODES = ("bypassPermissions", "permissionsByAgent", "default")
EVENT_TYPES = ("text", "tool_start", "tool_result", "reasoning", "error", "turn_complete", "compaction", "lifecycle")


def _stored(request: web.Request) -> Sessions:
    """The session records (listings read them directly: they are the same wherever a session runs)."""
    return Sessions(request.app[COMPONENTS].db)


def _mcp_servers(body: dict[str, Any]) -> dict[str, Any] | None:
    value = body.get("mcpServers")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("`mcpServers` must be an object of server configurations")
    for name, cfg in value.items():
        if not isinstance(cfg, dict):
            raise BadRequest(f"`mcpServers.{name}` must be an object")
        has_url, has_cmd = isinstance(cfg.get("url"), str), isinstance(cfg.get("command"), str)
        if has_url == has_cmd:
            raise BadRequest(f"`mcpServers.{name}` needs exactly one of `url` or `command`")
        args = cfg.get("args")
        if args is not None and (not isinstance(args, list) or not all(isinstance(a, str) for a in args)):
            raise BadRequest(f"`mcpServers.{name}.args` must be an array of strings")
        env = cfg.get("env")
        if env is not None and (not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            raise BadRequest(f"`mcpServers.{name}.env` must be an object of string values")
    return value


def _create_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    mode = opt_str(body, "permissionMode")
    if mode is not None and mode not in PERMISSION_MODES:
        raise BadRequest(f"`permissionMode` must be one of {', '.join(PERMISSION_MODES)}")
    if mode:
        config["permissionMode"] = mode
    for key in ("allowedTools", "disallowedTools", "betas"):
        value = opt_str_list(body, key)
        if value is not None:
            config[key] = value
    prompt = opt_str(body, "systemPrompt", max_len=1_000_000)
    if prompt is not None:
        config["systemPrompt"] = prompt
    servers = _mcp_servers(body)
    if servers is not None:
        config["mcpServers"] = servers
    subagents = body.get("subagents")
    if subagents is not None:
        if not isinstance(subagents, dict):
            raise BadRequest("`subagents` must be an object of subagent definitions")
        config["subagents"] = subagents
    initial = opt_str(body, "initialAgent", max_len=255)
    if initial is not None:
        if not isinstance(subagents, dict) or initial not in subagents:
            raise BadRequest("`initialAgent` must name one of the `subagents`")
        config["initialAgent"] = initial
    network = body.get("network")
    if network is not None:
        if not isinstance(network, bool):
            raise BadRequest("`network` must be a boolean")
        config["network"] = network
    return config


@routes.post("/api/sessions")
async def create_session(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    sessions = backend(request)
    body = await body_object(request)
    agent_name = req_str(body, "agent", max_len=255)
    ten = tenant(request)
    agent = await components.agents.resolve(ten, agent_name)  # 404 before anything is written
    await components.tenant_storage.require_room(ten, "a new session")
    config = _create_config(body)
    max_disk = components.settings.sandbox_disk_max_mb
    disk_mb = opt_disk_mb(body, max_disk) or agent.disk_mb
    if disk_mb is not None:
        if disk_mb > max_disk:  # the operator lowered the maximum after the agent was deployed
            raise BadRequest(f"agent {agent_name} asks for a sandbox disk of {disk_mb} MiB, above this server's "
                             f"maximum of {max_disk} MiB; send a smaller `diskMb` or update the agent")
        config["diskMb"] = disk_mb  # pinned: a cold resume gets the same size whatever the agent says later
    credential_id = opt_str(body, "credentialId", max_len=64)
    if credential_id is not None:
        await components.credentials.get(ten, credential_id)  # 404 for unknown or other tenant
    extra_env = opt_str_map(body, "extraEnv")
    session_id = new_id()
    encrypted = None
    if extra_env:
        config["extraEnvKeys"] = sorted(extra_env)
        encrypted = components.cipher.encrypt_json(extra_env, session_id.encode())
    new = NewSession(session_id=session_id, tenant=ten, agent_name=agent_name, agent=agent,
                     model=opt_str(body, "model", max_len=255), config=config, credential_id=credential_id,
                     encrypted_env=encrypted)
    try:
        session = await sessions.create(new)
    except SandboxError as exc:
        raise await _with_session_id(Sessions(components.db), ten, session_id, exc) from exc
    return ok({"session": session}, status=201, headers={"Location": f"/api/sessions/{session_id}"})


async def _with_session_id(sessions: Sessions, ten: str, session_id: str, exc: SandboxError) -> SandboxError:
    """A start that failed after the session was stored (its setup, say) names the session it left
    in `error`, so the client can read its events, resume it once fixed, or delete it."""
    try:
        row = await sessions.get(ten, session_id)
    except ServiceError:
        return exc  # nothing was stored: the error is all there is
    return SandboxError(f"{exc.message} (session {session_id} is left `{row.status}`: GET /api/sessions/"
                        f"{session_id}/logs has its output; resume or delete it)", headers=exc.headers)


@routes.get("/api/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    agent = request.query.get("agent") or None
    return ok({"sessions": await _stored(request).list_views(tenant(request), agent)})


@routes.get("/api/sessions/{id}")
async def get_session(request: web.Request) -> web.Response:
    return ok({"session": await backend(request).view(tenant(request), request.match_info["id"])})


@routes.post("/api/sessions/{id}/pause")
async def pause(request: web.Request) -> web.Response:
    return ok({"session": await backend(request).pause(tenant(request), request.match_info["id"])})


@routes.post("/api/sessions/{id}/resume")
async def resume(request: web.Request) -> web.Response:
    return ok({"session": await backend(request).resume(tenant(request), request.match_info["id"])})


@routes.post("/api/sessions/{id}/stop")
async def stop(request: web.Request) -> web.Response:
    return ok({"session": await backend(request).stop(tenant(request), request.match_info["id"])})


@routes.post("/api/sessions/{id}/interrupt")
async def interrupt(request: web.Request) -> web.Response:
    return ok(await backend(request).interrupt(tenant(request), request.match_info["id"]))


@routes.delete("/api/sessions/{id}")
async def delete(request: web.Request) -> web.Response:
    sessions = backend(request)
    purge = request.query.get("purge", "false").lower()
    if purge not in ("true", "false", "1", "0"):
        raise BadRequest("query `purge` must be `true` or `false`")
    session = await sessions.end(tenant(request), request.match_info["id"], purge=purge in ("true", "1"))
    return ok({"session": session})


@routes.get("/api/sessions/{id}/messages")
async def list_messages(request: web.Request) -> web.Response:
    stored = _stored(request)
    ten, sid = tenant(request), request.match_info["id"]
    limit = query_int(request, "limit", 100, 1, 1000)
    after = query_int(request, "after", 0, 0, 2**62)
    return ok({"messages": await stored.messages(ten, sid, after, limit)})


@routes.get("/api/sessions/{id}/events")
async def list_events(request: web.Request) -> web.Response:
    stored = _stored(request)
    ten, sid = tenant(request), request.match_info["id"]
    limit = query_int(request, "limit", 200, 1, 1000)
    after = query_int(request, "after", 0, 0, 2**62)
    type_ = request.query.get("type") or None
    if type_ is not None and type_ not in EVENT_TYPES:
        raise BadRequest(f"query `type` must be one of {', '.join(EVENT_TYPES)}")
    events = await stored.events(ten, sid, after, limit, type_)
    return ok({"events": events})


@routes.get("/api/sessions/{id}/logs")
async def list_logs(request: web.Request) -> web.Response:
    """The session's setup output and its sandbox's stderr, by index (`after` = -1: from the start)."""
    components = request.app[COMPONENTS]
    ten, sid = tenant(request), request.match_info["id"]
    row = await Sessions(components.db).get(ten, sid)
    limit = query_int(request, "limit", 1000, 1, 1000)
    after = query_int(request, "after", -1, -1, 2**62)
    logs = await SessionLogs(components.db).list(ten, sid, after, limit)
    # `live`: the session is starting or active, so more lines may come (`ashd sessions logs --follow`
    # follows until it is not).
    return ok({"logs": logs, "source": "live" if row.status in ("starting", "active") else "stored"})
