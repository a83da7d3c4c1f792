"""OpenAPI paths: health, metrics, documentation, and the internal (runner, operator) endpoints."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_common import INTERNAL, PUBLIC, body, op, path_param, reply
from ashd.http._openapi_schemas import STR, obj, ref

_OK = reply("Done", ref("Ok"))

PATHS: dict[str, dict[str, Any]] = {
    "/health": {
        "get": op("health", "Health of this server", "operations",
                  {200: reply("Always `ok` while the server answers", ref("HealthResponse"))},
                  security=PUBLIC),
    },
    "/metrics": {
        "get": op("metrics", "Prometheus metrics", "operations", {200: {
            "description": "Prometheus text format",
            "content": {"text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}}},
        }}, security=PUBLIC),
    },
    "/docs": {
        "get": op("docs", "Interactive API documentation", "operations", {200: {
            "description": "HTML page (Swagger UI, served locally)",
            "content": {"text/html": {"schema": {"type": "string"}}},
        }}, security=PUBLIC),
    },
    "/docs/assets/{file}": {
        "get": op("docsAsset", "A static file of the documentation UI", "operations", {200: {
            "description": "CSS, JavaScript or image", "content": {"*/*": {"schema": {"type": "string"}}},
        }}, errors=(404,), security=PUBLIC, params=[path_param("file", "asset file name")]),
    },
    "/openapi.json": {
        "get": op("openapi", "This OpenAPI document", "operations",
                  {200: reply("OpenAPI 3.1", {"type": "object"})}, security=PUBLIC),
    },
    "/api/internal/api-keys": {
        "post": op("mintTenantKey", "Mint an API key for any tenant (operators)", "internal",
                   {201: reply("The new key, shown once", ref("NewApiKey"))}, errors=(400,),
                   security=INTERNAL, request=body(obj({"tenantId": STR, "label": STR}, ("tenantId",)))),
    },
    "/api/internal/runners/register": {
        "post": op("registerRunner", "Register or re-register a runner (upsert)", "internal", {200: _OK},
                   errors=(400,), security=INTERNAL, request=body(ref("RegisterRunnerRequest"))),
    },
    "/api/internal/runners/heartbeat": {
        "post": op("runnerHeartbeat", "Report a runner's pool counts", "internal", {200: _OK},
                   errors=(400, 404), security=INTERNAL, request=body(ref("HeartbeatRequest")),
                   description="404 for an unknown runner: it registers again."),
    },
    "/api/internal/runners/deregister": {
        "post": op("deregisterRunner", "Graceful runner shutdown: its sessions are paused", "internal",
                   {200: _OK}, errors=(400, 404), security=INTERNAL, request=body(ref("DeregisterRequest"))),
    },
    "/api/internal/runners": {
        "get": op("listRunners", "List registered runners", "internal",
                  {200: reply("Runners", ref("RunnerList"))}, security=INTERNAL),
    },
}
