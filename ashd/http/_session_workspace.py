"""Workspace bundles: GET /api/sessions/{id}/workspace (a tar.gz of the live workspace, else of the
latest snapshot) and POST /api/sessions/{id}/workspace (a client's bundle restored into the live
workspace), in the shapes of ash-ai-sdk's generated models."""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from aiohttp import web

from ashd.actors._aio import call
from ashd.errors import BadRequest, DiskQuotaExceeded, NotFound, SandboxError
from ashd.http._json import body_object, ok, req_str, tenant
from ashd.http._keys import SERVICES
from ashd.storage._files import content_disposition
from ashd.storage._snapshots import bundle_budget, bundle_workspace, restore_bundle

routes = web.RouteTableDef()

_CHUNK = 256 * 1024


def _bundle_live(workspace: Path, spool_dir: Path, session_id: str, max_bytes: int) -> BinaryIO:
    out = tempfile.TemporaryFile(dir=spool_dir)  # noqa: SIM115 - returned open; on the data disk, unlinked
    try:
        bundle_workspace(workspace, out, bundle_budget(session_id, max_bytes))
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


@routes.get("/api/sessions/{id}/workspace")
async def download_workspace(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    ten, sid = tenant(request), request.match_info["id"]
    registry = services.sessions
    if registry is None:
        raise NotFound(f"Session {sid} not found")
    workspace = await registry.workspace(ten, sid)  # 404 for an unknown or another tenant's session
    settings = services.settings
    if workspace is not None and Path(workspace).is_dir():
        source = "sandbox"
        fh = await asyncio.to_thread(_bundle_live, Path(workspace), Path(settings.data_dir), sid,
                                     settings.snapshot_max_mb * 1024 * 1024)
    else:
        info = await call(services.snapshots.latest(sid), settings.actor_timeout_seconds) \
            if services.snapshots is not None else None
        if info is None:
            raise NotFound(f"No workspace available for session {sid}: it has no live sandbox and no snapshot")
        source = "snapshot"
        fh = await asyncio.to_thread(open, info.path, "rb")
    try:
        size = os.fstat(fh.fileno()).st_size
        resp = web.StreamResponse(headers={
            "Content-Type": "application/gzip",
            "Content-Disposition": content_disposition(f"workspace-{sid}.tar.gz"),
            "Content-Length": str(size),
            "X-Service-Source": source,
        })
        await resp.prepare(request)
        while chunk := await asyncio.to_thread(fh.read, _CHUNK):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        fh.close()


@routes.post("/api/sessions/{id}/workspace")
async def upload_workspace(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    ten, sid = tenant(request), request.match_info["id"]
    if services.sessions is None:
        raise NotFound(f"Session {sid} not found")
    body = await body_object(request)
    encoded = req_str(body, "bundle", max_len=services.settings.max_body_bytes)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("`bundle` must be a base64-encoded tar.gz archive") from exc

    def restore(workspace: Path, owner: tuple[int, int] | None) -> tuple[int, list[str]]:
        try:
            outcome = restore_bundle(data, workspace, owner)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the sandbox's own disk quota
                raise DiskQuotaExceeded("the session's workspace disk is full; the bundle was restored in part. "
                                        "Remove files or create the session with a larger `diskMb`") from exc
            raise SandboxError(f"the bundle could not be restored: {exc}") from exc
        return len(outcome.restored), outcome.skipped

    restored, skipped = await services.sessions.in_live_workspace(ten, sid, "restoring a workspace bundle", restore)
    return ok({"message": f"restored {restored} files and links into the workspace"
                          + (f"; skipped {len(skipped)} entries the rules refuse" if skipped else ""),
               "restored": restored, "skipped": skipped[:100]})
