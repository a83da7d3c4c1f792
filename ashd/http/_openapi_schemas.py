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
QUEUE_STATUS = ["pending", "processing", "completed", "failed", "cancelled"]
EVENT_TYPES = ["text", "tool_start", "tool_result", "reasoning", "error", "turn_complete", "compaction", "lifecycle"]

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
        "workspaceRestored": {"type": "boolean", "description": (
            "Only in the answer of a cold resume: whether the workspace came back from a snapshot. False: a "
            "fresh copy of the agent folder (e.g. its runner is gone and no SERVICE_SNAPSHOT_URL holds its "
            "workspace); the conversation is kept either way.")},
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
                                        "refuses calls past it: the turn ends with a `result` of subtype "
                                        "`error_max_budget_usd` and an `error` frame"},
        "maxTurns": {"type": "integer", "minimum": 1, "maximum": 1000,
                     "description": "the most model turns (calls of the agent loop) this message may take; the "
                                    "turn then ends with a `result` of subtype `error_max_turns`"},
        "effort": {"type": "string", "enum": ["low", "medium", "high", "max"],
                   "description": "the Messages API's `output_config.effort` for this message's model calls"},
        "thinking": obj({
            "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
            "budgetTokens": {"type": "integer", "minimum": 1024, "maximum": 128000,
                             "description": "with `enabled` only, and required with it: the thinking budget of "
                                            "each model call (its `max_tokens` becomes this plus 8192; the sum "
                                            "must stay within SERVICE_MODEL_MAX_TOKENS)"},
        }, ("type",), additionalProperties=False,
            description="Extended thinking for this message's model calls (the API's `thinking` block)"),
        "outputFormat": obj({
            "type": {"type": "string", "enum": ["json_schema"]},
            "schema": {"type": "object", "description": "a JSON Schema the final answer must validate against"},
        }, ("type", "schema"), additionalProperties=False,
            description="Structured output: the final answer is JSON valid against `schema`, carried by the "
                        "`result` message's `structured_output` (subtype `error_max_structured_output_retries` "
                        "when the model does not give one)"),
        "attachments": {"type": "array", "maxItems": 20, "uniqueItems": True, "items": UUID,
                        "description": "ids of the session's attachments: each is written to "
                                       "`attachments/<filename>` in the workspace; images (PNG, JPEG, GIF, WebP, "
                                       "up to 5 MiB) and PDFs (up to 10 MiB inline per message) are shown to the "
                                       "model as image/document blocks; the stored user message records them. "
                                       "An id that is not an attachment of this session is 400; a workspace disk "
                                       "without room for them is 507 (nothing is stored then)"},
    }, ("content",)),
    "SessionConfigRequest": obj({
        "model": {"type": ["string", "null"], "minLength": 1, "maxLength": 255,
                  "description": "the session's model; null: the agent's default"},
        "allowedTools": {"type": ["array", "null"], "items": STR, "description": "whitelist of tools offered"},
        "disallowedTools": {"type": ["array", "null"], "items": STR, "description": "blacklist (wins)"},
        "betas": {"type": ["array", "null"], "items": STR, "description": "`anthropic-beta` values"},
        "subagents": {"type": ["object", "null"],
                      "additionalProperties": {"type": "object", "properties": {
                          "description": STR, "prompt": STR, "tools": arr(STR), "model": STR}},
                      "description": "name → {description, prompt, tools?, model?}; replaces the session's"},
        "initialAgent": {"type": ["string", "null"], "minLength": 1, "maxLength": 255,
                         "description": "the subagent the main thread runs as; must name one of the subagents"},
    }, (), minProperties=1, description="Each key present replaces the session's value; null clears it."),
    "Attachment": obj({
        "id": UUID, "tenantId": STR, "sessionId": UUID,
        "messageId": {**STR, "description": "the message it is linked to: the upload's `messageId`, else the "
                                            "first message that named it"},
        "filename": STR, "mimeType": STR, "size": {**INT, "description": "bytes"}, "createdAt": TIME,
    }, ("id", "sessionId", "filename", "mimeType", "size", "createdAt")),
    "UploadAttachmentRequest": obj({
        "filename": {**STR, "maxLength": 255, "description": "a file name without directories (no `/` or `\\`, "
                                                            "no control characters, at most 255 bytes in UTF-8)"},
        "content": {**STR, "description": "the file's bytes, base64 (at most SERVICE_ATTACHMENT_MAX_MB once "
                                          "decoded; 413 above it)"},
        "mimeType": {**STR, "default": "application/octet-stream",
                     "description": "absent or `application/octet-stream`: detected from the content (images, "
                                    "PDF), else from the file name's extension. A declared image or PDF type "
                                    "must match the content (400)"},
        "messageId": {**UUID, "description": "link it to this message of the session (optional)"},
    }, ("filename", "content")),
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
    "LogLine": obj({
        "index": {**INT, "description": "from 0, increasing by one per line of the session"},
        "level": {"type": "string", "enum": ["stdout", "stderr", "system"]},
        "ts": TIME, "text": STR,
        "source": {"type": "string", "enum": ["setup", "sandbox"],
                   "description": "`setup`: the agent's setup output; `sandbox`: the sandbox's stderr"},
    }, ("index", "level", "ts", "text")),
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
        "totalBytes": {**INT, "description": "agents.bytes + history.bytes + snapshots.bytes + attachments.bytes"},
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
        "attachments": obj({"count": INT, "bytes": INT,
                            "maxBytes": {**INT, "description": "SERVICE_ATTACHMENT_MAX_MB"}}, ("count", "bytes")),
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
    "QueueItem": obj({
        "id": UUID, "tenantId": STR, "agentName": STR, "prompt": STR,
        "status": {"type": "string", "enum": QUEUE_STATUS},
        "priority": {**INT, "description": "higher runs first; equal priorities run oldest first"},
        "retryCount": {**INT, "description": "retries done so far"}, "maxRetries": INT,
        "sessionId": {"type": ["string", "null"], "description": "the session the prompt runs (or ran) in"},
        "error": {"type": ["string", "null"], "description": "why the last attempt failed"},
        "result": {"type": ["string", "null"], "description": "the turn's `result` text, once completed"},
        "createdAt": TIME, "startedAt": NULL_TIME, "completedAt": NULL_TIME,
        "nextAttemptAt": {**NULL_TIME, "description": "when a pending retry is due (exponential backoff)"},
    }, ("id", "agentName", "prompt", "status", "priority", "retryCount", "maxRetries", "createdAt")),
    "CreateQueueItemRequest": obj({
        "agentName": STR,
        "prompt": {"type": "string", "maxLength": 500_000},
        "sessionId": {**UUID, "description": "run in this session (resumed if paused); default: a new session, "
                                             "paused after the turn"},
        "priority": {**INT, "default": 0, "minimum": -1_000_000, "maximum": 1_000_000},
        "maxRetries": {**INT, "default": 3, "minimum": 0, "maximum": 100},
    }, ("agentName", "prompt")),
    "QueueStats": obj({k: INT for k in QUEUE_STATUS}, tuple(QUEUE_STATUS)),
}
