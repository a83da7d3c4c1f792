"""OpenAPI component schemas: the interface's resources, plus request bodies shared by paths."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
UUID: Schema = {"type": "string", "format": "uuid"}
TIME: Schema = {"type": "string", "format": "date-time"}
NULL_TIME: Schema = {"type": ["string", "null"], "format": "date-time"}
NULL_STR: Schema = {"type": ["string", "null"]}
STR_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}


def arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


DISK_MB: Schema = {"type": "integer", "minimum": 32,
                   "description": "sandbox disk quota in MiB (workspace, HOME, /tmp), at most the server's "
                                  "SERVICE_SANDBOX_DISK_MAX_MB; default: the agent's, else SERVICE_SANDBOX_DISK_MB"}
SESSION_STATUS = ["starting", "active", "paused", "stopped", "ended", "error"]
CREDENTIAL_TYPES = ["anthropic", "openai", "bedrock", "custom"]
EVENT_TYPES = ["text", "tool_start", "tool_result", "reasoning", "error", "turn_complete", "lifecycle"]

SCHEMAS: dict[str, Schema] = {
    "ApiError": obj({"error": STR, "statusCode": INT}, ("error", "statusCode")),
    "Ok": obj({"ok": BOOL}, ("ok",)),
    "Agent": obj({
        "id": UUID, "name": STR, "tenantId": STR,
        "version": {"type": "integer", "description": "incremented on each deploy of the same name"},
        "path": {"type": "string", "description": "absolute path of the agent directory on the server"},
        "model": {"type": ["string", "null"], "description": "agent default model (precedence step 3)"},
        "env": {"type": "object", "additionalProperties": {"type": "string", "const": "***"},
                "description": "names of the agent's environment variables; values are never returned"},
        "network": {"type": "boolean", "description": "sessions of this agent get network access"},
        "diskMb": {"type": ["integer", "null"], "description": "sandbox disk size of its sessions; null: the "
                                                               "server's default (SERVICE_SANDBOX_DISK_MB)"},
        "createdAt": TIME, "updatedAt": TIME,
    }, ("id", "name", "version", "path", "createdAt", "updatedAt")),
    "AgentFileUpload": obj({
        "path": {"type": "string", "description": "relative path in the agent folder; no `..`, not absolute"},
        "content": {"type": "string", "description": (
            "UTF-8 text, or base64 with `encoding: base64`. Without `encoding` on any file of the "
            "request, contents that are all canonical base64 are decoded (as the reference "
            "implementation's clients send them)")},
        "encoding": {"type": "string", "enum": ["base64", "utf-8"]},
    }, ("path", "content")),
    "DeployAgentRequest": obj({
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,255}$"},
        "path": {"type": "string", "description": "server directory containing AGENT.md; a relative path "
                                                  "resolves against the server data directory"},
        "systemPrompt": {"type": "string", "description": "becomes AGENT.md of a server-managed folder"},
        "files": arr(ref("AgentFileUpload")),
        "model": STR,
        "env": STR_MAP,
        "network": BOOL,
        "diskMb": DISK_MB,
    }, ("name",), description="Give `path`, or `files` and/or `systemPrompt` (never both). Redeploying a "
                              "name updates it and increments `version`."),
    "PatchAgentRequest": obj({"model": NULL_STR, "env": {"type": ["object", "null"],
                                                          "additionalProperties": {"type": "string"}},
                              "network": BOOL, "diskMb": {**DISK_MB, "type": ["integer", "null"]}},
                             description="No new version; `null` clears model, env or diskMb."),
    "FileEntry": obj({"path": STR, "size": INT, "modifiedAt": TIME}, ("path", "size", "modifiedAt")),
    "FileContent": obj({"path": STR, "content": STR, "size": INT,
                        "source": {"type": "string", "enum": ["sandbox", "snapshot"]}},
                       ("path", "content", "size")),
    "McpServerConfig": obj({
        "url": {"type": "string", "description": "remote MCP server; exclusive with `command`"},
        "command": {"type": "string", "description": "stdio MCP server; exclusive with `url`"},
        "args": arr(STR), "env": STR_MAP,
    }),
    "Session": obj({
        "id": UUID, "tenantId": STR, "agentName": STR, "sandboxId": STR,
        "status": {"type": "string", "enum": SESSION_STATUS},
        "model": NULL_STR, "runnerId": NULL_STR,
        "parentSessionId": {"type": ["string", "null"], "format": "uuid"},
        "createdAt": TIME, "lastActiveAt": TIME,
    }, ("id", "agentName", "sandboxId", "status", "createdAt", "lastActiveAt"), additionalProperties=True,
        description="Also carries the configuration it was created with (secrets masked)."),
    "CreateSessionRequest": obj({
        "agent": STR, "model": STR,
        "mcpServers": {"type": "object", "additionalProperties": ref("McpServerConfig")},
        "systemPrompt": STR, "credentialId": STR, "extraEnv": STR_MAP,
        "permissionMode": {"type": "string", "enum": ["bypassPermissions", "permissionsByAgent", "default"]},
        "allowedTools": arr(STR), "disallowedTools": arr(STR), "betas": arr(STR),
        "subagents": {"type": "object"}, "initialAgent": STR,
        "diskMb": DISK_MB,
    }, ("agent",)),
    "SendMessageRequest": obj({
        "content": {"oneOf": [{"type": "string", "maxLength": 500000}, arr({"type": "object"})]},
        "model": STR, "includePartialMessages": BOOL,
        "maxBudgetUsd": {"type": "number", "exclusiveMinimum": 0,
                         "description": "the most this message's model calls may cost, in USD; the model proxy "
                                        "refuses calls past it (the turn ends with an `error` frame)"},
        # Options of the published client (ash-ai-sdk): accepted so that its requests pass the
        # strict body check, and not used by ashd.
        "maxTurns": {"type": "integer", "description": "sent by ash-ai-sdk; accepted, not used"},
        "effort": {"type": "string", "description": "sent by ash-ai-sdk; accepted, not used"},
        "thinking": {"type": "object", "description": "sent by ash-ai-sdk; accepted, not used"},
        "outputFormat": {"type": "object", "description": "sent by ash-ai-sdk; accepted, not used"},
    }, ("content",)),
    "Message": obj({
        "id": UUID, "sessionId": UUID, "tenantId": STR,
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"type": "string", "description": "JSON-encoded message content (SDK passthrough)"},
        "sequence": INT, "createdAt": TIME,
    }, ("id", "sessionId", "role", "content", "sequence", "createdAt")),
    "SessionEvent": obj({
        "id": UUID, "sessionId": UUID, "tenantId": STR, "type": {"type": "string", "enum": EVENT_TYPES},
        "data": {"type": ["string", "null"], "description": "JSON-encoded event payload"},
        "sequence": INT, "createdAt": TIME,
    }, ("id", "sessionId", "type", "sequence", "createdAt")),
    "Credential": obj({
        "id": UUID, "tenantId": STR, "type": {"type": "string", "enum": CREDENTIAL_TYPES},
        "label": NULL_STR, "active": BOOL, "createdAt": TIME, "lastUsedAt": NULL_TIME,
    }, ("id", "type", "createdAt")),
    "BedrockKey": obj({"accessKeyId": STR, "secretAccessKey": STR, "region": STR, "sessionToken": STR},
                      ("accessKeyId", "secretAccessKey", "region"), additionalProperties=False),
    "CreateCredentialRequest": obj({
        "type": {"type": "string", "enum": CREDENTIAL_TYPES},
        "key": {"oneOf": [STR, ref("BedrockKey")],
                "description": "the secret; for bedrock a BedrockKey object or a JSON string of one"},
        "label": STR,
    }, ("type", "key")),
    "UsageEvent": obj({
        "id": UUID, "tenantId": STR, "sessionId": UUID, "agentName": STR,
        "eventType": {"type": "string", "description": "input_tokens, output_tokens, cache_creation_tokens, "
                      "cache_read_tokens, cost_usd (one set per model call, as the model proxy saw it), "
                      "tool_calls, message, compute_seconds (per turn: the sandbox's CPU time in the turn, "
                      "from its cgroup; wall time where the host has no CPU accounting)"},
        "value": NUM, "createdAt": TIME,
    }, ("id", "sessionId", "agentName", "eventType", "value", "createdAt")),
    "UsageStats": obj({k: NUM for k in (
        "totalInputTokens", "totalOutputTokens", "totalCacheCreationTokens", "totalCacheReadTokens",
        "totalToolCalls", "totalMessages", "totalComputeSeconds")},
        ("totalInputTokens", "totalOutputTokens", "totalCacheCreationTokens", "totalCacheReadTokens",
         "totalToolCalls", "totalMessages", "totalComputeSeconds")),
    "ModelCall": obj({
        "id": UUID, "sessionId": UUID, "tenantId": STR, "agentName": STR,
        "sequence": {"type": "integer", "description": "per-session cursor for `after`"},
        "endpoint": {"type": "string", "description": "`messages`, `count_tokens`, or the path asked for"},
        "model": {"type": ["string", "null"], "description": "the model the call asked for"},
        "stream": BOOL, "maxTokens": {"type": ["integer", "null"]},
        "status": {"type": "integer", "description": "HTTP status the sandbox got"},
        "outcome": {"type": "string", "enum": ["ok", "error", "refused", "aborted"]},
        "reason": {"type": ["string", "null"], "description": "refusal reason (model, max_tokens, rate, "
                   "turn_budget, session_budget, tenant_budget, no_turn, invalid, ...) or the API's error type"},
        "detail": NULL_STR,
        "inputTokens": INT, "outputTokens": INT, "cacheCreationTokens": INT, "cacheReadTokens": INT,
        "costUsd": {"type": "number", "description": "from the price table"},
        "latencyMs": NUM, "firstByteMs": {"type": ["number", "null"]},
        "sandboxId": STR, "queryId": NULL_STR,
        "server": {"type": "string", "description": "the server process whose model proxy saw the call"},
        "createdAt": TIME,
    }, ("id", "sessionId", "sequence", "endpoint", "model", "status", "outcome", "inputTokens", "outputTokens",
        "cacheCreationTokens", "cacheReadTokens", "costUsd", "latencyMs", "createdAt")),
    "PoolStats": obj({k: INT for k in (
        "total", "cold", "warming", "warm", "waiting", "running", "maxCapacity", "resumeWarmHits",
        "resumeColdHits", "preWarmHits")},
        ("total", "cold", "warming", "warm", "waiting", "running", "maxCapacity", "resumeWarmHits",
         "resumeColdHits", "preWarmHits")),
    "HealthResponse": obj({
        "status": {"type": "string", "enum": ["ok"]}, "version": STR, "coordinatorId": STR,
        "activeSessions": INT, "activeSandboxes": INT, "remoteRunners": INT, "uptime": INT,
        "pool": ref("PoolStats"), "mode": {"type": "string", "enum": ["standalone", "coordinator"]},
        "isolation": {"type": "object"},
        "warnings": {"type": "array", "items": STR,
                     "description": "configuration an operator should fix (also logged at start)"},
        "dataDir": ref("DataDirSpace"),
    }, ("status", "activeSessions", "activeSandboxes", "uptime", "pool")),
    "DataDirSpace": obj({
        "state": {"type": "string", "enum": ["ok", "low", "full"],
                  "description": "`low`: below warnFreeBytes; `full`: below minFreeBytes, requests that add "
                                 "stored data get 507"},
        "freeBytes": INT, "totalBytes": INT, "minFreeBytes": INT, "warnFreeBytes": INT,
    }, ("state", "freeBytes", "totalBytes", "minFreeBytes", "warnFreeBytes")),
    "StorageHoldings": obj({
        "tenantId": STR,
        "totalBytes": {**INT, "description": "agents.bytes + history.bytes + snapshots.bytes"},
        "limitBytes": {"type": ["integer", "null"], "description": "SERVICE_TENANT_STORAGE_MB; null: no limit"},
        "agents": obj({"count": INT, "limit": {"type": ["integer", "null"]}, "bytes": INT,
                       "maxUploadBytes": INT}, ("count", "bytes")),
        "sessions": obj({"count": INT}, ("count",)),
        "history": obj({"messages": INT, "events": INT, "bytes": INT, "maxTurnBytes": INT, "maxTurnEvents": INT},
                       ("messages", "events", "bytes")),
        "snapshots": obj({"count": INT, "bytes": INT, "keepPerSession": INT, "maxWorkspaceBytes": INT},
                         ("count", "bytes")),
        "credentials": obj({"count": INT, "limit": {"type": ["integer", "null"]}}, ("count",)),
        "apiKeys": obj({"count": INT, "limit": {"type": ["integer", "null"]}}, ("count",)),
    }, ("tenantId", "totalBytes", "limitBytes", "agents", "sessions", "history", "snapshots")),
    "ApiKey": obj({"id": UUID, "label": NULL_STR, "keyPrefix": STR, "createdAt": TIME,
                   "lastUsedAt": NULL_TIME}, ("id", "keyPrefix", "createdAt")),
    "NewApiKey": obj({"id": UUID, "key": {"type": "string", "description": "shown once; store it"},
                      "tenantId": STR}, ("id", "key")),
    "RegisterRunnerRequest": obj({"runnerId": STR, "host": STR, "port": INT, "maxSandboxes": INT},
                                 ("runnerId", "host", "port")),
    "HeartbeatRequest": obj({"runnerId": STR, "stats": ref("PoolStats"), "activeCount": INT}, ("runnerId",)),
    "DeregisterRequest": obj({"runnerId": STR}, ("runnerId",)),
    "Runner": obj({"runnerId": STR, "host": STR, "port": INT, "maxSandboxes": INT, "activeCount": INT,
                   "warmingCount": INT, "lastHeartbeatAt": TIME}, ("runnerId", "host", "port"),
                  additionalProperties=True),
    "RunnerList": obj({"runners": arr(ref("Runner")), "count": INT, "hasLocal": BOOL},
                      ("runners", "count", "hasLocal")),
}
