"""Agents: deploy (upsert), list, get, patch, delete, and read the agent folder's files."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from aiohttp import web

from ashd.errors import BadRequest, NotFound
from ashd.http._json import body_object, ok, opt_disk_mb, opt_str, opt_str_map, req_str, tenant
from ashd.http._keys import SERVICES
from ashd.http._uploads import files_from_body
from ashd.storage import _files
from ashd.storage._agent_paths import fd_path, open_dir
from ashd.storage._agents import KEEP, Agents

routes = web.RouteTableDef()
_CHUNK = 256 * 1024


def _agents(request: web.Request) -> Agents:
    return Agents.of(request.app[SERVICES])


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
    storage = request.app[SERVICES].tenant_storage
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
        disk_mb=opt_disk_mb(body, request.app[SERVICES].settings.sandbox_disk_max_mb),
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
        disk_mb=opt_disk_mb(body, request.app[SERVICES].settings.sandbox_disk_max_mb) if "diskMb" in body else KEEP,
    )
    return ok({"agent": record.to_json()})


@routes.delete("/api/agents/{name}")
async def delete_agent(request: web.Request) -> web.Response:
    await _agents(request).delete(tenant(request), request.match_info["name"])
    return ok({"ok": True})


@contextmanager
def _opened(folder: Path) -> Iterator[Path]:
    """The agent folder opened without following links; yields a path bound to that directory, so
    a folder renamed or swapped for a link meanwhile cannot redirect the reads."""
    try:
        fd = open_dir(folder)
    except OSError as exc:
        raise NotFound("The agent's folder is no longer at the path it was deployed from; redeploy the agent") \
            from exc
    try:
        yield fd_path(fd)
    finally:
        os.close(fd)


def _list(folder: Path) -> list[dict[str, Any]]:
    with _opened(folder) as root:
        return [f.to_json() for f in _files.list_files(root)]


@routes.get("/api/agents/{name}/files")
async def list_files(request: web.Request) -> web.Response:
    folder = await _agents(request).folder(tenant(request), request.match_info["name"])
    return ok({"files": await asyncio.to_thread(_list, folder)})


def _read_json(folder: Path, rel: str) -> dict[str, Any]:
    with _opened(folder) as root:
        stream, size = _files.open_file(root, rel)
    with stream:
        _files.check_json_size(size)
        data = stream.read(_files.JSON_LIMIT + 1)
    _files.check_json_size(len(data))
    content = _files.decode_text(data)
    return {"path": _files.check_relative_path(rel), "content": content, "size": len(content.encode())}


def _open(folder: Path, rel: str) -> tuple[BinaryIO, int]:
    with _opened(folder) as root:
        return _files.open_file(root, rel)


@routes.get("/api/agents/{name}/files/{path:.*}")
async def get_file(request: web.Request) -> web.StreamResponse:
    root = await _agents(request).folder(tenant(request), request.match_info["name"])
    rel = request.match_info["path"]
    fmt = request.query.get("format", "json")
    if fmt == "json":
        return ok(await asyncio.to_thread(_read_json, root, rel))
    if fmt != "raw":
        raise BadRequest("query `format` must be `json` or `raw`")
    fh, size = await asyncio.to_thread(_open, root, rel)
    try:
        _files.check_raw_size(size)
        cleaned = _files.check_relative_path(rel)
        resp = web.StreamResponse(headers={
            "Content-Type": _files.mime_type(cleaned),
            "Content-Disposition": _files.content_disposition(cleaned),
            "Content-Length": str(size),
        })
        await resp.prepare(request)
        remaining = size
        while remaining > 0:
            chunk = await asyncio.to_thread(fh.read, min(_CHUNK, remaining))
            if not chunk:
                break  # truncated while being read; the client sees a short body
            await resp.write(chunk)
            remaining -= len(chunk)
        await resp.write_eof()
        return resp
    finally:
        await asyncio.to_thread(fh.close)
