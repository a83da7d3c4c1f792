"""Session files: from the live sandbox while it exists, else from the latest snapshot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from ashd.actors._aio import call
from ashd.errors import BadRequest, NotFound
from ashd.http._json import body_object, ok, opt_str, tenant
from ashd.http._keys import SERVICES
from ashd.http._uploads import files_from_body
from ashd.services import Services
from ashd.storage import _files

routes = web.RouteTableDef()

MAX_UPLOAD_FILES = 1000


async def _source(services: Services, ten: str, sid: str) -> tuple[str, Path | None, Any]:
    registry = services.sessions
    if registry is None:
        raise NotFound(f"Session {sid} not found")
    workspace = await registry.workspace(ten, sid)
    if workspace is not None and Path(workspace).is_dir():
        return "sandbox", Path(workspace), None
    snap = services.snapshots
    if snap is not None:
        reader = await call(snap.reader(sid), services.settings.actor_timeout_seconds)
        if reader is not None:
            return "snapshot", None, reader
    raise NotFound(f"No workspace available for session {sid}: it has no live sandbox and no snapshot")


@routes.get("/api/sessions/{id}/files")
async def list_files(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    source, root, reader = await _source(services, tenant(request), request.match_info["id"])
    if root is not None:
        entries = await asyncio.to_thread(_files.list_files, root)
    else:
        try:
            entries = await asyncio.to_thread(reader.list_files)
        finally:
            reader.close()
    return ok({"files": [e.to_json() for e in entries], "source": source})


@routes.get("/api/sessions/{id}/files/{path:.*}")
async def get_file(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    rel = request.match_info["path"]
    if not rel:
        raise BadRequest("file path is missing: GET /api/sessions/{id}/files/<path>")
    fmt = request.query.get("format", "raw")
    if fmt not in ("raw", "json"):
        raise BadRequest("query `format` must be `raw` or `json`")
    _files.check_relative_path(rel)
    source, root, reader = await _source(services, tenant(request), request.match_info["id"])
    try:
        if fmt == "json":
            if root is not None:
                # Checked on the open descriptor: the sandbox may swap a path component meanwhile.
                text = await asyncio.to_thread(_files.DirectoryReader(root).read_for_json, rel)
            else:
                text = await asyncio.to_thread(reader.read_for_json, rel)
            return ok({"path": rel, "content": text, "size": len(text.encode()), "source": source})
        if root is not None:
            fh, size = await asyncio.to_thread(_files.open_file, root, rel)
        else:
            fh, size = await asyncio.to_thread(reader.open_file, rel)
    finally:
        if reader is not None and fmt == "json":
            reader.close()
    try:
        _files.check_raw_size(size)
        resp = web.StreamResponse(headers={
            "Content-Type": _files.mime_type(rel),
            "Content-Disposition": _files.content_disposition(rel),
            "Content-Length": str(size),
            "X-Service-Source": source,
        })
        await resp.prepare(request)
        while True:
            chunk = await asyncio.to_thread(fh.read, 256 * 1024)
            if not chunk:
                break
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        fh.close()
        if reader is not None:
            reader.close()


@routes.post("/api/sessions/{id}/files")
async def upload_files(request: web.Request) -> web.Response:
    """Write files into the live workspace of an active session (ash-ai-sdk's `{files: [{path, content,
    mimeType?}], targetPath}`; contents read as agent uploads are: text, or base64 as its clients send)."""
    services = request.app[SERVICES]
    if services.sessions is None:
        raise NotFound(f"Session {request.match_info['id']} not found")
    body = await body_object(request)
    raw = body.get("files")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("`files` must be a non-empty array of {path, content}")
    if len(raw) > MAX_UPLOAD_FILES:
        raise BadRequest(f"at most {MAX_UPLOAD_FILES} files per request; send the rest in another")
    files = files_from_body(raw) or []
    target = opt_str(body, "targetPath", max_len=4096) or "."
    written = await services.sessions.write_files(tenant(request), request.match_info["id"], target, files)
    return ok({"files": [{"path": path, "size": len(f.data)} for path, f in zip(written, files, strict=True)]})
