"""Agents: deploy (upsert), list, get, patch, delete, and read the agent folder's files."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._file_response import send_file
from ashd.http._json import body_object, ok, opt_disk_mb, opt_str, opt_str_map, req_str, tenant
from ashd.http._keys import COMPONENTS
from ashd.http._uploads import files_from_body
from ashd.storage import KEEP, AgentFolderReader, Agents, check_relative_path

routes = web.RouteTableDef()


def _agents(request: web.Request) -> Agents:
    return request.app[COMPONENTS].agents


def _opt_bool(body: dict[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"`{key}` must be a boolean")
    return value


@routes.post("/api/agents")
async def deploy(request: web.Request) -> web.Response:
    body = await body_object(request)
    agents, ten, name = _agents(request), tenant(request), req_str(body, "name", max_len=255)
    files = files_from_body(body.get("files"))
    system_prompt = opt_str(body, "systemPrompt", max_len=1_000_000)
    storage = request.app[COMPONENTS].tenant_storage
    uploaded = sum(len(f.data) for f in files or []) + len((system_prompt or "").encode())
    await storage.require_room(ten, "deploying this agent", adding=uploaded)
    if not await agents.exists(ten, name):
        await storage.require_count_below(ten, "agents")
    record = await agents.deploy(
        ten, name,
        path=opt_str(body, "path", max_len=4096),
        files=files,
        system_prompt=system_prompt,
        model=opt_str(body, "model", max_len=255),
        env=opt_str_map(body, "env"),
        network=_opt_bool(body, "network"),
        disk_mb=opt_disk_mb(body, request.app[COMPONENTS].settings.sandbox_disk_max_mb),
    )
    return ok({"agent": record.to_json()}, status=201)


@routes.get("/api/agents")
async def list_agents(request: web.Request) -> web.Response:
    return ok({"agents": [a.to_json() for a in await _agents(request).list(tenant(request))]})


@routes.get("/api/agents/{name}")
async def get_agent(request: web.Request) -> web.Response:
    record = await _agents(request).get(tenant(request), request.match_info["name"])
    return ok({"agent": record.to_json()})


@routes.patch("/api/agents/{name}")
async def patch_agent(request: web.Request) -> web.Response:
    body = await body_object(request)
    if not {"model", "env", "network", "diskMb"} & set(body):
        raise BadRequest("nothing to update: send `model`, `env`, `network` and/or `diskMb`")
    record = await _agents(request).patch(
        tenant(request), request.match_info["name"],
        model=opt_str(body, "model", max_len=255) if "model" in body else KEEP,
        env=opt_str_map(body, "env") if "env" in body else KEEP,
        network=bool(_opt_bool(body, "network")) if "network" in body else KEEP,
        disk_mb=opt_disk_mb(body, request.app[COMPONENTS].settings.sandbox_disk_max_mb) if "diskMb" in body else KEEP,
    )
    return ok({"agent": record.to_json()})


@routes.delete("/api/agents/{name}")
async def delete_agent(request: web.Request) -> web.Response:
    await _agents(request).delete(tenant(request), request.match_info["name"])
    return ok({"ok": True})


@routes.get("/api/agents/{name}/files")
async def list_files(request: web.Request) -> web.Response:
    reader = AgentFolderReader(await _agents(request).folder(tenant(request), request.match_info["name"]))
    return ok({"files": [e.to_json() for e in await asyncio.to_thread(reader.list_files)]})


@routes.get("/api/agents/{name}/files/{path:.*}")
async def get_file(request: web.Request) -> web.StreamResponse:
    reader = AgentFolderReader(await _agents(request).folder(tenant(request), request.match_info["name"]))
    rel = request.match_info["path"]
    fmt = request.query.get("format", "json")
    if fmt == "json":
        content = await asyncio.to_thread(reader.read_for_json, rel)
        return ok({"path": check_relative_path(rel), "content": content, "size": len(content.encode())})
    if fmt != "raw":
        raise BadRequest("query `format` must be `json` or `raw`")
    cleaned = check_relative_path(rel)
    stream, size = await asyncio.to_thread(reader.open_file, cleaned)
    return await send_file(request, stream, size, cleaned)
