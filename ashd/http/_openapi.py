"""The OpenAPI 3.1 document of the whole server, served at GET /openapi.json.

Written by hand (in `_openapi_*.py`) rather than generated, so it can say what the code cannot:
error cases, limits, the SSE frame format. `tests/integration/test_openapi.py` keeps it honest: the
document must validate and list exactly the routes the aiohttp router serves.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from ashd import API_VERSION
from ashd.http import (
    _openapi_paths_ops,
    _openapi_paths_queue,
    _openapi_paths_resources,
    _openapi_paths_sessions,
    _openapi_paths_webhooks,
)
from ashd.http._openapi_common import error_responses
from ashd.http._openapi_schemas import SCHEMAS

_TAGS = [
    ("agents", "Deploy and inspect agents (a folder with AGENT.md)"),
    ("sessions", "Conversations with agents, each in its own sandbox"),
    ("credentials", "Model and service keys, stored encrypted, injected into sessions"),
    ("attachments", "Files given to a session; a message names them and the model sees images and PDFs"),
    ("usage", "Token usage per model call (metered by the server), tool calls and compute per turn"),
    ("api-keys", "API keys of the caller's tenant"),
    ("webhooks", "Signed HTTP callbacks for turn, session and queue events (docs/webhooks.md)"),
    ("queue", "Prompts queued to run later as turns, with retries"),
    ("operations", "Health, metrics and documentation (no authentication)"),
    ("internal", "Runner and operator endpoints (internal secret)"),
]

# Every schema of the document: the shared ones and those a paths module declares beside its paths.
_SCHEMAS = {**SCHEMAS, **_openapi_paths_webhooks.SCHEMAS}


def _closed_request_bodies(paths: dict[str, Any]) -> None:
    """Every JSON request body object refuses unknown fields (ashd.http._strict enforces it)."""
    for item in paths.values():
        for op in item.values():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if schema is None:
                continue
            target = _SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else schema
            if target.get("type") == "object":
                target.setdefault("additionalProperties", False)


@functools.cache
def _document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for module in (_openapi_paths_resources, _openapi_paths_sessions, _openapi_paths_queue, _openapi_paths_ops,
                   _openapi_paths_webhooks):
        for path, item in module.PATHS.items():
            paths.setdefault(path, {}).update(item)
    _closed_request_bodies(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ashd",
            "version": API_VERSION,
            "description": "Hosted agent orchestration: agents behind a REST API, replies as Server-Sent "
                           "Events, one sandbox per session. Every error body is an ApiError.",
        },
        "servers": [{"url": "/"}],
        "tags": [{"name": name, "description": text} for name, text in _TAGS],
        "security": [{"bearerApiKey": []}],
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "responses": error_responses(),
            "securitySchemes": {
                "bearerApiKey": {
                    "type": "http", "scheme": "bearer",
                    "description": "`Authorization: Bearer <API key>`; the key maps to a tenant",
                },
                "internalSecret": {"type": "http", "scheme": "bearer",
                                   "description": "`Authorization: Bearer <internal secret>`: SERVICE_INTERNAL_SECRET, "
                                                  "or the one generated into `<data dir>/internal-secret`"},
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may not mutate the cached one)."""
    return copy.deepcopy(_document())
