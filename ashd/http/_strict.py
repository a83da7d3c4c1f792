"""Strict input: a body field or a query parameter the operation does not know is a 400 that names
it and the closest known name (a typo such as `systemPromt` is otherwise silently ignored), and a
query value outside what the operation documents is a 400 naming the parameter.

What is known comes from the OpenAPI document itself (request body properties, query parameters
with their types, enums and bounds), so the document and the validation cannot disagree. Fields
that the published client (ash-ai-sdk) sends are in the document, marked as accepted and unused
where ashd has no use for them.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web

from ashd.errors import BadRequest
from ashd.http._openapi import openapi_document

# Router and document name path parameters differently (`{path:.*}`, `{sid}`): compare shapes only.
_PARAM = re.compile(r"\{[^}]*\}")


@dataclass(frozen=True)
class _Operation:
    body_fields: frozenset[str] | None  # None: the operation takes no JSON object body
    query: dict[str, dict[str, Any]]


def _resolve(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


@functools.cache
def _operations() -> dict[tuple[str, str], _Operation]:
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    found: dict[tuple[str, str], _Operation] = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            fields = None
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                body = _resolve(content["application/json"]["schema"], schemas)
                if body.get("type") == "object" and body.get("additionalProperties") is False:
                    fields = frozenset(body.get("properties", {}))
            query = {p["name"]: p["schema"] for p in op.get("parameters", []) if p.get("in") == "query"}
            found[(method.upper(), _PARAM.sub("{}", path))] = _Operation(fields, query)
    return found


def _operation(request: web.Request) -> _Operation | None:
    route = request.match_info.route
    if route.resource is None:
        return None
    return _operations().get((request.method, _PARAM.sub("{}", route.resource.canonical)))


def _unknown(kind: str, name: str, known: frozenset[str] | set[str]) -> BadRequest:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean `{close[0]}`?" if close else ""
    accepted = f" Known {kind}s: {', '.join(f'`{k}`' for k in sorted(known))}." if known else \
        f" This operation takes no {kind}s."
    return BadRequest(f"unknown {kind} `{name}`{hint}{accepted}")


def check_body(request: web.Request, body: dict[str, Any]) -> None:
    """400 for a top-level body field the operation does not document."""
    op = _operation(request)
    if op is None or op.body_fields is None:
        return
    for name in body:
        if name not in op.body_fields:
            raise _unknown("body field", name, op.body_fields)


def _check_value(name: str, raw: str, schema: dict[str, Any]) -> None:
    kind = schema.get("type")
    if "enum" in schema and raw not in schema["enum"]:
        raise BadRequest(f"query `{name}` must be one of {', '.join(map(str, schema['enum']))}, not {raw!r}")
    if kind == "integer":
        try:
            value = int(raw)
        except ValueError as exc:
            raise BadRequest(f"query `{name}` must be an integer, not {raw!r}") from exc
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"from {lo} to {hi}" if lo is not None and hi is not None else \
                f"at least {lo}" if lo is not None else f"at most {hi}"
            raise BadRequest(f"query `{name}` must be an integer {bounds}, not {raw}")
    elif kind == "boolean" and raw not in ("true", "false", "1", "0"):
        raise BadRequest(f"query `{name}` must be true or false, not {raw!r}")
    elif kind == "string" and schema.get("format") == "date-time":
        try:
            datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError as exc:
            raise BadRequest(f"query `{name}` must be an ISO 8601 date-time, not {raw!r}") from exc


def check_query(request: web.Request) -> None:
    op = _operation(request)
    if op is None:
        return
    for name, raw in request.query.items():
        if name not in op.query:
            raise _unknown("query parameter", name, set(op.query))
        _check_value(name, raw, op.query[name])


def check_api_query(request: web.Request) -> None:
    """Query parameters of /api/ operations, checked before the handler runs (after authentication)."""
    if request.path.startswith("/api/") and request.query_string:
        check_query(request)
