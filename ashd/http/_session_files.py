"""Session files: from the live sandbox while it exists, else from the latest snapshot."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._file_response import send_file
from ashd.http._json import ok, tenant
from ashd.http._keys import backend
from ashd.storage import check_relative_path

routes = web.RouteTableDef()


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
