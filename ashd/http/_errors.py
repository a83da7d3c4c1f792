"""Every failure of a request becomes an ApiError `{error, statusCode}`."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from ashd.compact_json import dumps
from ashd.errors import ServiceError
from ashd.storage import storage_failure

log = logging.getLogger(__name__)

_HTTP_MESSAGES = {
    404: "Not found: no such route. See /docs for the API",
    405: "Method not allowed on this route. See /docs for the API",
    413: "Request body too large",
}


def api_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=dumps({"error": message, "statusCode": status}),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(request: web.Request, exc: Exception) -> web.Response:
    """The ApiError a failure of `request` is answered with (called where it was caught). An
    HTTPException below 400 (a redirect) is not a failure: it is raised again."""
    if isinstance(exc, ServiceError):
        if exc.status_code == 500:  # e.g. "sandbox creation failed" because the disk is full: say so
            exc = storage_failure(exc) or exc
        if exc.status_code >= 500:
            log.warning("request failed: %s", exc.message, extra={"path": request.path, "status": exc.status_code})
        return api_error(exc.status_code, exc.message, exc.headers)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        message = _HTTP_MESSAGES.get(exc.status) or exc.reason
        if exc.status == 405 and isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            message = f"Method {request.method} not allowed on {request.path}; allowed: {allowed}"
        if exc.status == 413:
            message = f"Request body too large: the limit is {request.client_max_size} bytes"
        headers = {k: v for k, v in exc.headers.items() if k.lower() in {"allow", "retry-after"}}
        return api_error(exc.status, message, headers)
    mapped = storage_failure(exc)  # a full disk met outside the database layer (files, tar)
    if mapped is not None:
        log.warning("request failed: %s", mapped.message, extra={"path": request.path,
                                                                "status": mapped.status_code})
        return api_error(mapped.status_code, mapped.message)
    log.error("unhandled error", exc_info=exc, extra={"path": request.path, "method": request.method})
    return api_error(500, "Internal server error; the incident was logged")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:  # noqa: BLE001 - every failure is answered, as an ApiError
        return error_response(request, exc)
