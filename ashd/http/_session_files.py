"""Session files: from the live sandbox while it exists, else from the latest snapshot."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._file_response import send_file
from ashd.http._json import body_object, ok, opt_str, tenant
from ashd.http._keys import backend
from ashd.http._uploads import files_from_body
from ashd.storage import check_relative_path

routes = web.RouteTableDef()

MAX_UPLOAD_FILES = 1000


@routes.get("/api/sessions/{id}/files")
async def list_files(request: web.Request) -> web.Response:
    files = await backend(request).files(tenant(request), request.match_info["id"])
    try:
        entries = await asyncio.to_thread(files.reader.list_files)
    finally:
        files.reader.close()
    return ok({"files": [e.to_json() for e in entries], "source": files.source})


@routes.get("/api/sessions/{id}/files/{path:.*}")
async def get_file(request: web.Request) -> web.StreamResponse:
    rel = request.match_info["path"]
    if not rel:
        raise BadRequest("file path is missing: GET /api/sessions/{id}/files/<path>")
    fmt = request.query.get("format", "raw")
    if fmt not in ("raw", "json"):
        raise BadRequest("query `format` must be `raw` or `json`")
    check_relative_path(rel)
    files = await backend(request).files(tenant(request), request.match_info["id"])
    try:
        if fmt == "json":
            text = await asyncio.to_thread(files.reader.read_for_json, rel)
            return ok({"path": rel, "content": text, "size": len(text.encode()), "source": files.source})
        stream, size = await asyncio.to_thread(files.reader.open_file, rel)
        return await send_file(request, stream, size, rel, {"X-Service-Source": files.source})
    finally:
        files.reader.close()


@routes.post("/api/sessions/{id}/files")
async def upload_files(request: web.Request) -> web.Response:
    """Write files into the live workspace of an active session (ash-ai-sdk's `{files: [{path, content,
    mimeType?}], targetPath}`; contents read as agent uploads are: text, or base64 as its clients send)."""
    body = await body_object(request)
    raw = body.get("files")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("`files` must be a non-empty array of {path, content}")
    if len(raw) > MAX_UPLOAD_FILES:
        raise BadRequest(f"at most {MAX_UPLOAD_FILES} files per request; send the rest in another")
    files = files_from_body(raw) or []
    target = opt_str(body, "targetPath", max_len=4096) or "."
    written = await backend(request).write_files(tenant(request), request.match_info["id"], target, files)
    return ok({"files": [{"path": path, "size": len(f.data)} for path, f in zip(written, files, strict=True)]})
