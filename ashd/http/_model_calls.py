"""GET /api/sessions/{id}/model-calls: the audit of a session's model traffic, as the proxy saw it."""

from __future__ import annotations

import logging

from aiohttp import web

from ashd.http._json import ok, query_int, tenant
from ashd.http._keys import COMPONENTS
from ashd.storage import Sessions, list_model_calls

routes = web.RouteTableDef()
log = logging.getLogger(__name__)


@routes.get("/api/sessions/{id}/model-calls")
async def model_calls(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    ten, sid = tenant(request), request.match_info["id"]
    await Sessions(components.db).get(ten, sid)  # 404 for unknown or another tenant's session
    limit = query_int(request, "limit", 100, 1, 1000)
    after = query_int(request, "after", 0, 0, 2**62)
    proxy = components.model_proxy
    if proxy is not None:
        try:
            await proxy.flush()  # calls that just finished are listed too
        except Exception:  # noqa: BLE001 - list what is stored; the rest is retried by the writer
            log.warning("model call records not stored yet", extra={"sessionId": sid})
    return ok({"modelCalls": await list_model_calls(components.db, ten, sid, after, limit)})
