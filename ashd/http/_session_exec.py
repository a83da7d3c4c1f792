"""POST /api/sessions/{id}/exec: a shell command in the session's sandbox, run for the API client,
not through the model (the shape of ash-ai-sdk's generated models)."""

from __future__ import annotations

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._json import body_object, ok, req_str, tenant
from ashd.http._keys import backend

routes = web.RouteTableDef()

# Milliseconds, as the engine's Bash tool counts them.
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 600_000
MAX_COMMAND_CHARS = 100_000


def _timeout_ms(value: object) -> int:
    if value is None:
        return DEFAULT_TIMEOUT_MS
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= MAX_TIMEOUT_MS:
        raise BadRequest(f"`timeout` must be a number of milliseconds from 1 to {MAX_TIMEOUT_MS}")
    return int(value)


@routes.post("/api/sessions/{id}/exec")
async def exec_command(request: web.Request) -> web.Response:
    body = await body_object(request)
    command = req_str(body, "command", max_len=MAX_COMMAND_CHARS)
    timeout_ms = _timeout_ms(body.get("timeout"))
    result = await backend(request).exec(tenant(request), request.match_info["id"], ["bash", "-c", command],
                                         timeout_ms / 1000)
    return ok(result)
