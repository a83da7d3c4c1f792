"""Workspace bundles: GET /api/sessions/{id}/workspace (a tar.gz of the live workspace, else of the
latest snapshot) and POST /api/sessions/{id}/workspace (a client's bundle restored into the live
workspace), in the shapes of ash-ai-sdk's generated models."""

from __future__ import annotations

import asyncio
import base64
import binascii

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._json import body_object, ok, req_str, tenant
from ashd.http._keys import COMPONENTS, backend
from ashd.storage import content_disposition

routes = web.RouteTableDef()

_CHUNK = 256 * 1024


@routes.get("/api/sessions/{id}/workspace")
async def download_workspace(request: web.Request) -> web.StreamResponse:
    sid = request.match_info["id"]
    bundle = await backend(request).bundle(tenant(request), sid)
    try:
        resp = web.StreamResponse(headers={
            "Content-Type": "application/gzip",
            "Content-Disposition": content_disposition(f"workspace-{sid}.tar.gz"),
            "Content-Length": str(bundle.size),
            "X-Service-Source": bundle.source,
        })
        await resp.prepare(request)
        while chunk := await asyncio.to_thread(bundle.stream.read, _CHUNK):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        bundle.stream.close()


@routes.post("/api/sessions/{id}/workspace")
async def upload_workspace(request: web.Request) -> web.Response:
    body = await body_object(request)
    encoded = req_str(body, "bundle", max_len=request.app[COMPONENTS].settings.max_body_bytes)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("`bundle` must be a base64-encoded tar.gz archive") from exc
    restored, skipped = await backend(request).restore_bundle(tenant(request), request.match_info["id"], data)
    return ok({"message": f"restored {restored} files and links into the workspace"
                          + (f"; skipped {len(skipped)} entries the rules refuse" if skipped else ""),
               "restored": restored, "skipped": skipped[:100]})
