"""Request parsing and JSON responses."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ashd.compact_json import dumps
from ashd.config import MIN_DISK_MB
from ashd.errors import BadRequest
from ashd.http._keys import TENANT
from ashd.http._strict import check_body


def ok(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=dumps(payload), status=status, content_type="application/json", headers=headers)


async def body_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest("Request body is empty: send a JSON object with Content-Type: application/json")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequest("Request body must be a JSON object")
    check_body(request, value)
    return value


def tenant(request: web.Request) -> str:
    return str(request[TENANT])


def opt_str(body: dict[str, Any], key: str, *, max_len: int = 100_000) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"`{key}` must be a string")
    if len(value) > max_len:
        raise BadRequest(f"`{key}` is longer than {max_len} characters")
    return value


def req_str(body: dict[str, Any], key: str, *, max_len: int = 100_000) -> str:
    value = opt_str(body, key, max_len=max_len)
    if value is None or not value.strip():
        raise BadRequest(f"`{key}` is required")
    return value


def opt_str_list(body: dict[str, Any], key: str) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"`{key}` must be an array of strings")
    return list(value)


def opt_str_map(body: dict[str, Any], key: str) -> dict[str, str] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRequest(f"`{key}` must be an object of string values")
    return dict(value)


def opt_disk_mb(body: dict[str, Any], max_mb: int) -> int | None:
    """`diskMb`: the sandbox disk size a session or an agent asks for, within the operator's maximum."""
    value = body.get("diskMb")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_DISK_MB <= value <= max_mb:
        raise BadRequest(f"`diskMb` must be an integer from {MIN_DISK_MB} to {max_mb}: the sandbox disk size "
                         "in MiB, at most this server's maximum (SERVICE_SANDBOX_DISK_MAX_MB)")
    return value


def query_int(request: web.Request, key: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise BadRequest(f"query `{key}` must be an integer") from exc
    if not lo <= value <= hi:
        raise BadRequest(f"query `{key}` must be between {lo} and {hi}")
    return value
