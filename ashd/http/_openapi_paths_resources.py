"""OpenAPI paths: agents, credentials, attachments, usage, API keys."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_common import body, op, path_param, query, reply, wrapped
from ashd.http._openapi_schemas import INT, STR, TIME, obj, ref

NAME = path_param("name", "agent name")
CRED_ID = path_param("id", "credential id", fmt="uuid")
ATTACHMENT_ID = path_param("id", "attachment id", fmt="uuid")
FILE_PATH = path_param("path", "file path relative to the agent folder (may contain `/`)")
FORMAT = query("format", {"type": "string", "enum": ["json", "raw"], "default": "json"},
               "`json`: `{path, content, size}` (UTF-8 text, up to 1 MB); `raw`: the bytes (up to 100 MB)")
AGENT = wrapped("agent", ref("Agent"))
CREDENTIAL = wrapped("credential", ref("Credential"))
USAGE_FILTERS = [
    query("sessionId", STR, "only this session"),
    query("agentName", STR, "only this agent"),
    query("after", TIME, "only events created after this instant (exclusive)"),
    query("before", TIME, "only events created before this instant (exclusive)"),
]

PATHS: dict[str, dict[str, Any]] = {
    "/api/agents": {
        "post": op("deployAgent", "Deploy an agent (upsert by name)", "agents",
                   {201: reply("Deployed; `version` is 1 or incremented", AGENT)}, errors=(400, 409, 413, 507),
                   description="409: the tenant has SERVICE_TENANT_MAX_AGENTS agents, or its storage limit is "
                               "reached. 413: the upload is over SERVICE_AGENT_MAX_UPLOAD_MB.",
                   request=body(ref("DeployAgentRequest"))),
        "get": op("listAgents", "List the tenant's agents", "agents",
                  {200: reply("The agents, by name", wrapped("agents", ref("Agent"), many=True))}),
    },
    "/api/agents/{name}": {
        "get": op("getAgent", "Get an agent", "agents", {200: reply("The agent", AGENT)},
                  errors=(404,), params=[NAME]),
        "patch": op("patchAgent", "Update model, env or network without a new version", "agents",
                    {200: reply("The updated agent", AGENT)}, errors=(400, 404), params=[NAME],
                    request=body(ref("PatchAgentRequest"))),
        "delete": op("deleteAgent", "Remove the registration (sessions stay)", "agents",
                     {200: reply("Removed", ref("Ok"))}, errors=(404,), params=[NAME]),
    },
    "/api/agents/{name}/files": {
        "get": op("listAgentFiles", "List the agent folder's files", "agents",
                  {200: reply("Files, recursively, by path", wrapped("files", ref("FileEntry"), many=True))},
                  errors=(404,), params=[NAME]),
    },
    "/api/agents/{name}/files/{path}": {
        "get": op("getAgentFile", "Read one file of the agent folder", "agents", {200: {
            "description": "JSON `{path, content, size}`, or the raw bytes with Content-Type from the "
                           "extension, `Content-Disposition: attachment; filename*=UTF-8''…` and "
                           "Content-Length",
            "content": {"application/json": {"schema": ref("FileContent")},
                        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }}, errors=(400, 404), params=[NAME, FILE_PATH, FORMAT],
            description="400: the path is empty, has `..`, starts with `/`, names a directory, the file is "
                        "larger than the format allows, or is binary with format=json. 404: no such file, "
                        "or a symlink leading outside the folder."),
    },
    "/api/credentials": {
        "post": op("createCredential", "Store a credential (encrypted; the key is never returned)",
                   "credentials", {201: reply("Stored", CREDENTIAL)}, errors=(400, 409),
                   request=body(ref("CreateCredentialRequest"))),
        "get": op("listCredentials", "List the tenant's credentials", "credentials",
                  {200: reply("Credentials, oldest first",
                              wrapped("credentials", ref("Credential"), many=True))}),
    },
    "/api/credentials/{id}": {
        "get": op("getCredential", "Get a credential (without its key)", "credentials",
                  {200: reply("The credential", CREDENTIAL)}, errors=(404,), params=[CRED_ID]),
        "delete": op("deleteCredential", "Delete a credential", "credentials", {204: reply("Deleted")},
                     errors=(404,), params=[CRED_ID]),
    },
    "/api/attachments/{id}": {
        "get": op("downloadAttachment", "Download an attachment's bytes", "attachments", {200: {
            "description": "The bytes, with the attachment's `mimeType` as Content-Type, `Content-Disposition: "
                           "attachment; filename*=UTF-8''…`, `X-Content-Type-Options: nosniff` and "
                           "`Content-Security-Policy: sandbox`",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }}, errors=(404,), params=[ATTACHMENT_ID]),
        "delete": op("deleteAttachment", "Delete an attachment (files already written to a workspace stay)",
                     "attachments", {204: reply("Deleted")}, errors=(404,), params=[ATTACHMENT_ID]),
    },
    "/api/usage": {
        "get": op("listUsage", "List usage events", "usage",
                  {200: reply("Events ascending by createdAt",
                              wrapped("events", ref("UsageEvent"), many=True))},
                  errors=(400,), params=[
                      *USAGE_FILTERS,
                      query("limit", {**INT, "minimum": 1, "maximum": 1000, "default": 100}, "page size"),
                  ]),
    },
    "/api/usage/stats": {
        "get": op("getUsageStats", "Sum the usage events", "usage",
                  {200: reply("Totals of the matching events", wrapped("stats", ref("UsageStats")))},
                  errors=(400,), params=USAGE_FILTERS),
    },
    "/api/storage": {
        "get": op("getStorage", "What the tenant holds on the server, and its limits", "usage",
                  {200: reply("Counts and bytes of agents, stored history and snapshots",
                              wrapped("storage", ref("StorageHoldings")))}),
    },
    "/api/api-keys": {
        "get": op("listApiKeys", "List the tenant's API keys", "api-keys",
                  {200: reply("Keys (never the secret)", wrapped("keys", ref("ApiKey"), many=True))}),
        "post": op("createApiKey", "Mint an API key for the caller's tenant", "api-keys",
                   {201: reply("The new key, shown once", ref("NewApiKey"))}, errors=(400, 409),
                   request=body(obj({"label": STR}), required=False)),
    },
    "/api/api-keys/{id}": {
        "delete": op("deleteApiKey", "Revoke an API key of the caller's tenant (409 for the key of "
                     "SERVICE_API_KEY: change the setting instead)", "api-keys",
                     {200: reply("Deleted", ref("Ok"))}, errors=(404, 409),
                     params=[path_param("id", "API key id", fmt="uuid")]),
    },
}
