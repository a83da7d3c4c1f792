"""Attachments: upload (base64) to a session, list, download, delete; in the shapes of ash-ai-sdk's
generated models. A message names them in `attachments` (http/_session_stream.py)."""

from __future__ import annotations

import base64
import binascii
import re

from aiohttp import web

from ashd.errors import BadRequest, PayloadTooLarge
from ashd.http._json import body_object, ok, opt_str, req_str, tenant
from ashd.http._keys import COMPONENTS
from ashd.storage import MIB, Attachments, check_filename, content_disposition, resolve_mime

routes = web.RouteTableDef()
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _attachments(request: web.Request) -> Attachments:
    return Attachments(request.app[COMPONENTS].db)


def _decode(encoded: str, limit: int) -> bytes:
    """The base64 `content`, within `limit` bytes (413 above it; checked before decoding too)."""
    compact = "".join(encoded.split())  # line-wrapped base64 (as `base64` prints it) is accepted
    too_large = PayloadTooLarge(
        f"the attachment is larger than {limit // MIB} MiB, the most one attachment may be "
        "(SERVICE_ATTACHMENT_MAX_MB); put larger files into the workspace with POST /api/sessions/{id}/files "
        "or a workspace bundle")
    if len(compact) // 4 * 3 > limit + 2:
        raise too_large
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("`content` must be the file's bytes in base64") from exc
    if len(data) > limit:
        raise too_large
    return data


@routes.post("/api/sessions/{id}/attachments")
async def upload_attachment(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    body = await body_object(request)
    filename = check_filename(req_str(body, "filename", max_len=1024))
    encoded = body.get("content")
    if not isinstance(encoded, str):
        raise BadRequest("`content` is required: the file's bytes in base64")
    data = _decode(encoded, components.settings.attachment_max_mb * MIB)
    mime = resolve_mime(opt_str(body, "mimeType", max_len=255), filename, data)
    message_id = opt_str(body, "messageId", max_len=64)
    if message_id is not None and not _UUID.match(message_id):
        raise BadRequest("`messageId` must be the id (a UUID) of one of the session's messages")
    ten, sid = tenant(request), request.match_info["id"]
    await components.tenant_storage.require_room(ten, "a new attachment", adding=len(data))
    record = await _attachments(request).create(ten, sid, filename, mime, data,
                                                message_id.lower() if message_id else None)
    return ok({"attachment": record.to_json()}, status=201, headers={"Location": f"/api/attachments/{record.id}"})


@routes.get("/api/sessions/{id}/attachments")
async def list_attachments(request: web.Request) -> web.Response:
    records = await _attachments(request).list(tenant(request), request.match_info["id"])
    return ok({"attachments": [r.to_json() for r in records]})


@routes.get("/api/attachments/{id}")
async def download_attachment(request: web.Request) -> web.Response:
    found = await _attachments(request).read(tenant(request), request.match_info["id"])
    return web.Response(body=found.data, headers={
        "Content-Type": found.record.mime_type,
        "Content-Disposition": content_disposition(found.record.filename),
        # The bytes are the client's: never sniffed into something else, never run as a page.
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'",
    })


@routes.delete("/api/attachments/{id}")
async def delete_attachment(request: web.Request) -> web.Response:
    await _attachments(request).delete(tenant(request), request.match_info["id"])
    return web.Response(status=204)
