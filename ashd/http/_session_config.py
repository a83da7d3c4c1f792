"""PATCH /api/sessions/{id}/config: the session's model, tools, betas and subagents, changed for its
next turns (the published client's `patch_api_sessions_id_config`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._json import body_object, ok, tenant
from ashd.http._keys import backend

routes = web.RouteTableDef()
LIVE_KEYS = ("model", "allowedTools", "disallowedTools", "betas", "subagents", "initialAgent")
_SUBAGENT_STRINGS = ("description", "prompt", "model")


def _opt_string(body: dict[str, Any], key: str, max_len: int) -> str | None:
    value = body[key]
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"`{key}` must be a non-empty string, or null to clear it")
    if len(value) > max_len:
        raise BadRequest(f"`{key}` is longer than {max_len} characters")
    return value


def _str_list(body: dict[str, Any], key: str) -> list[str] | None:
    value = body[key]
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"`{key}` must be an array of strings, or null to clear it")
    return list(value)


def _subagents(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("`subagents` must be an object of subagent definitions (name → {description, prompt, "
                         "tools?, model?}), or null to clear it")
    for name, definition in value.items():
        if not isinstance(definition, dict):
            raise BadRequest(f"`subagents.{name}` must be an object {{description, prompt, tools?, model?}}")
        for key in _SUBAGENT_STRINGS:
            if definition.get(key) is not None and not isinstance(definition[key], str):
                raise BadRequest(f"`subagents.{name}.{key}` must be a string")
        tools = definition.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
            raise BadRequest(f"`subagents.{name}.tools` must be an array of strings")
    return value


def live_config(body: dict[str, Any]) -> dict[str, Any]:
    """The changes a PATCH asks for: each key present (null clears it), checked as at create time.
    Whether `initialAgent` names one of the subagents is checked against the merged config."""
    changes: dict[str, Any] = {}
    for key in LIVE_KEYS:
        if key not in body:
            continue
        if key in ("model", "initialAgent"):
            changes[key] = _opt_string(body, key, 255)
        elif key == "subagents":
            changes[key] = _subagents(body[key])
        else:
            changes[key] = _str_list(body, key)
    if not changes:
        raise BadRequest(f"Nothing to change: send at least one of {', '.join(LIVE_KEYS)}")
    return changes


@routes.patch("/api/sessions/{id}/config")
async def update_config(request: web.Request) -> web.Response:
    changes = live_config(await body_object(request))
    session = await backend(request).configure(tenant(request), request.match_info["id"], changes)
    return ok({"session": session})
