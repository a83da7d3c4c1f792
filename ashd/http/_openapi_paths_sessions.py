"""OpenAPI paths: sessions, their messages, stream, events and files."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_common import body, op, path_param, query, reply, wrapped
from ashd.http._openapi_schemas import BOOL, EVENT_TYPES, INT, STR, UUID, obj, ref

SID = path_param("id", "session id", fmt="uuid")
SESSION = wrapped("session", ref("Session"))
SSE_TEXT = (
    "Server-Sent Events. Frames `event: message` (an SDK message, passed through unchanged), "
    "`event: error` (`{error}`; `{error, limit}` when the sandbox hit its `memory`, `pids` or `disk` limit, "
    "after which the turn goes on) and exactly one final `event: done` (`{sessionId}`). Each frame has an "
    "`id:` (its stored event sequence) for reconnecting with `Last-Event-ID`; `: ping` comments every 15 s."
)
SSE = {"description": SSE_TEXT, "content": {"text/event-stream": {"schema": {"type": "string"}}}}
PAGE_100 = query("limit", {**INT, "minimum": 1, "maximum": 1000, "default": 100}, "page size")
PAGE_200 = query("limit", {**INT, "minimum": 1, "maximum": 1000, "default": 200}, "page size")
AFTER = query("after", INT, "sequence cursor: only records with a greater sequence")


def _action(op_id: str, summary: str, errors: tuple[int, ...], description: str) -> dict[str, Any]:
    return {"post": op(op_id, summary, "sessions", {200: reply("The session", SESSION)}, errors=errors,
                       params=[SID], description=description)}


PATHS: dict[str, dict[str, Any]] = {
    "/api/sessions": {
        "post": op("createSession", "Create a session for a deployed agent", "sessions",
                   {201: reply("The session, `active` once its sandbox is ready", SESSION)},
                   errors=(400, 404, 409, 500, 503, 507), request=body(ref("CreateSessionRequest")),
                   description="409: the tenant's storage limit is reached. 507: the server's data disk is "
                               "full or below its reserve."),
        "get": op("listSessions", "List the tenant's sessions", "sessions",
                  {200: reply("Sessions", wrapped("sessions", ref("Session"), many=True))},
                  params=[query("agent", STR, "only sessions of this agent")]),
    },
    "/api/sessions/{id}": {
        "get": op("getSession", "Get a session", "sessions", {200: reply("The session", SESSION)},
                  errors=(404,), params=[SID]),
        "delete": op("endSession", "End a session (sandbox destroyed, history kept)", "sessions",
                     {200: reply("The session, `ended`", SESSION)}, errors=(400, 404, 507), params=[
                         SID, query("purge", {**BOOL, "default": False},
                                    "also delete the session's snapshots, messages and events (the session is "
                                    "then gone: 404), freeing what the tenant holds for it")],
                     description="The workspace is snapshotted first; when the disk is full that fails with "
                                 "507 and the session stays as it was (nothing is lost). A workspace over the "
                                 "snapshot limit does not stop the end: its previous snapshot stays, and the "
                                 "`ended` lifecycle event says why no new one was taken."),
    },
    "/api/sessions/{id}/pause": _action(
        "pauseSession", "Pause an active session", (400, 404),
        "Only an `active` session can be paused; any other status is 400 naming it. A running turn is "
        "interrupted first (its stream ends with `error {error: \"interrupted: session paused\"}` then "
        "`done`), stored, and then the session is paused."),
    "/api/sessions/{id}/resume": _action(
        "resumeSession", "Resume a session (warm or cold path)", (404, 410, 500, 503, 507),
        "Warm when the original sandbox is alive, else cold with the workspace restored from a snapshot. "
        "An `active` session is returned as is; an `ended` one is 410."),
    "/api/sessions/{id}/stop": _action(
        "stopSession", "Stop a session: persist the workspace, destroy the sandbox", (400, 404, 413, 507),
        "From `active` or `starting`; a stopped session can be resumed (cold) or ended. 413: the workspace "
        "holds more than a snapshot may store (SERVICE_SNAPSHOT_MAX_MB); 507: the data disk is full. In both "
        "cases the sandbox stays and nothing is lost."),
    "/api/sessions/{id}/workspace": {
        "get": op("downloadWorkspace", "Download the workspace as a tar.gz", "sessions",
                  {200: {"description": "The workspace (excluded paths left out), from the live sandbox or else the "
                                        "latest snapshot; `X-Service-Source` says which",
                         "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}}},
                  errors=(404, 413), params=[SID],
                  description="413 when the live workspace holds more than SERVICE_SNAPSHOT_MAX_MB of files."),
        "post": op("uploadWorkspace", "Restore a tar.gz bundle into the live workspace", "sessions",
                   {200: reply("What was restored", obj({
                       "message": STR, "restored": INT,
                       "skipped": {"type": "array", "items": STR,
                                   "description": "entries the rules refused (at most 100 listed)"}},
                       ("message", "restored", "skipped")))},
                   errors=(400, 404, 413, 500, 503, 507), params=[SID],
                   request=body(obj({"bundle": {**STR, "description": "base64 of a tar or tar.gz archive"}},
                                    ("bundle",))),
                   description="The session must be `active`. Entries are extracted under the snapshot rules "
                               "(no `..`, no absolute or escaping links, no devices, no set-uid bits, never "
                               "written through a link) and belong to the sandbox user; existing files with "
                               "the same names are replaced. 507: the sandbox's disk quota is full."),
    },
    "/api/sessions/{id}/fork": {
        "post": op("forkSession", "Fork a session: its workspace and conversation in a new session", "sessions",
                   {201: reply("The new session, `active`, with `parentSessionId`", SESSION)},
                   errors=(404, 409, 413, 500, 503, 507), params=[SID],
                   description="The workspace is taken from the live sandbox, else the latest snapshot; the "
                               "conversation (its messages) is copied, so the new session's model sees it, as "
                               "on a cold resume. Lifecycle event `forked` on both sessions (`childSessionId`, "
                               "`parentSessionId`). 409: the session is still starting, or the tenant's storage "
                               "limit is reached. 413: the workspace is over SERVICE_SNAPSHOT_MAX_MB. 507: the "
                               "data disk is full."),
    },
    "/api/sessions/{id}/exec": {
        "post": op("execInSession", "Run a shell command in the session's sandbox", "sessions",
                   {200: reply("The command's exit code and output", obj({
                       "exitCode": INT, "stdout": STR, "stderr": STR,
                       "timedOut": {**BOOL, "description": "present and true when the timeout killed it"}},
                       ("exitCode", "stdout", "stderr")))},
                   errors=(400, 404, 500, 503), params=[SID],
                   request=body(obj({"command": {**STR, "description": "run by `bash -c` in /workspace"},
                                     "timeout": {**INT, "minimum": 1, "maximum": 600000, "default": 60000,
                                                 "description": "milliseconds; the command's process group is "
                                                                "killed when it passes"}}, ("command",))),
                   description="Not through the model: the command runs in the sandbox as the engine's Bash "
                               "tool runs one (same isolation, limits and output caps: 1 MiB per stream). "
                               "The session must be `active`; a sandbox that died is brought back first. "
                               "A non-zero exit is still 200."),
    },
    "/api/sessions/{id}/config": {
        "patch": op("updateSessionConfig", "Change the session's model, tools, betas or subagents", "sessions",
                    {200: reply("The session with its new config", SESSION)},
                    errors=(400, 404, 409, 410), params=[SID], request=body(ref("SessionConfigRequest")),
                    description="Checked as at creation, stored with the session and applied from its next "
                                "turn (a running turn keeps its own): a live sandbox gets it with that turn, a "
                                "resumed one (warm or cold) too. 400: a bad value, or `initialAgent` not among "
                                "the subagents. 409: the session is still starting. 410: the session has "
                                "ended."),
    },
    "/api/sessions/{id}/interrupt": {
        "post": op("interruptSession", "Abort the running turn", "sessions",
                   {200: reply("Interrupted", obj({"ok": BOOL, "sessionId": UUID}, ("ok", "sessionId")))},
                   errors=(404, 409), params=[SID],
                   description="The stream ends with `error {error: \"interrupted\"}` then `done`; "
                               "409 when no turn is running."),
    },
    "/api/sessions/{id}/messages": {
        "post": op("sendMessage", "Send a message; the reply streams as SSE", "sessions", {200: SSE},
                   errors=(400, 404, 409, 503, 507), params=[SID], request=body(ref("SendMessageRequest")),
                   description="Errors before the stream starts are JSON ApiErrors (409 also when the tenant's "
                               "storage limit is reached, 507 when the data disk is full); after it starts they "
                               "are `error` frames followed by `done`. A turn that reaches its storage bound "
                               "(SERVICE_TURN_MAX_STORED_MB, SERVICE_TURN_MAX_EVENTS) is stopped with an `error` "
                               "frame. Frames that could not be stored (full disk) are named by an `error` frame "
                               "without `id:`, and `done` then has no `id:` either."),
        "get": op("listMessages", "List the session's stored messages", "sessions",
                  {200: reply("Messages ascending by sequence",
                              wrapped("messages", ref("Message"), many=True))},
                  errors=(400, 404), params=[SID, PAGE_100, AFTER]),
    },
    "/api/sessions/{id}/events": {
        "get": op("listSessionEvents", "List the session's stored events", "sessions",
                  {200: reply("Events ascending by sequence",
                              wrapped("events", ref("SessionEvent"), many=True))},
                  errors=(400, 404),
                  params=[SID, PAGE_200, AFTER,
                          query("type", {"type": "string", "enum": EVENT_TYPES}, "only events of this type")],
                  description="`lifecycle` events carry `{action, ...}`: `created`, `paused`, `resumed`, "
                              "`stopped`, `ended`, `forked`, `error`, and `setup`: one line the agent's setup "
                              "printed, stored as it came, `{action: \"setup\", step, level, text, index}` "
                              "(`level` stdout, stderr or system; `index` is the line's in "
                              "`GET /api/sessions/{id}/logs`). `compaction` events (ashd's own type, not in "
                              "the reference's list) are listed only with `type=compaction`."),
    },
    "/api/sessions/{id}/logs": {
        "get": op("getSessionLogs", "The session's setup output and sandbox stderr", "sessions",
                  {200: reply("Log lines ascending by index", {
                      "type": "object", "required": ["logs", "source"], "properties": {
                          "logs": {"type": "array", "items": ref("LogLine")},
                          "source": {"type": "string", "enum": ["live", "stored"],
                                     "description": "`live`: the session is `starting` or `active`, more lines "
                                                    "may come; `stored`: any other status"}}})},
                  errors=(400, 404), params=[
                      SID, query("after", {**INT, "minimum": -1, "default": -1},
                                 "index cursor: only lines with a greater index (-1: from the first)"),
                      query("limit", {**INT, "minimum": 1, "maximum": 1000, "default": 1000}, "page size")],
                  description="Every line the agent's setup (`npm install`, `setup.sh`) printed, stdout and "
                              "stderr apart, and what the session's sandbox wrote to its stderr (the bridge, "
                              "the engine, MCP servers), in the order they were stored. `level` is `stdout`, "
                              "`stderr` or `system` (notes of ashd: a step started or ended, output cut). "
                              "Bounded: a line is cut at 4000 characters, a setup stores at most "
                              "SERVICE_SETUP_LOG_LINES lines, a session keeps its newest "
                              "SERVICE_SESSION_LOG_LINES lines (older indexes are then gone). Stored: the "
                              "lines outlive the sandbox and a server restart. Sandbox lines are stored about "
                              "once a second."),
    },
    "/api/sessions/{id}/model-calls": {
        "get": op("listModelCalls", "List the session's model calls (audit)", "sessions",
                  {200: reply("Model calls ascending by sequence",
                              wrapped("modelCalls", ref("ModelCall"), many=True))},
                  errors=(400, 404), params=[SID, PAGE_100, AFTER],
                  description="Every call the session's sandbox made to the model proxy, as the server saw "
                              "it: forwarded calls with the tokens the model API reported and their cost, and "
                              "refused ones with the reason."),
    },
    "/api/sessions/{id}/stream": {
        "get": op("replayStream", "Replay missed frames and follow a running turn", "sessions", {200: SSE},
                  errors=(400, 404), params=[
                      SID, query("after", INT, "replay frames after this event sequence"),
                      {"name": "Last-Event-ID", "in": "header", "required": False, "schema": STR,
                       "description": "the last frame id the client saw (alternative to `after`)"}]),
    },
    "/api/sessions/{id}/files": {
        "get": op("listSessionFiles", "List workspace files (live sandbox, else snapshot)", "sessions",
                  {200: reply("Files and where they were read from", {
                      "type": "object", "required": ["files", "source"], "properties": {
                          "files": {"type": "array", "items": ref("FileEntry")},
                          "source": {"type": "string", "enum": ["sandbox", "snapshot"]}}})},
                  errors=(404,), params=[SID, query("includeHidden", {**BOOL, "default": True},
                                                    "accepted for client compatibility")]),
        "post": op("uploadSessionFiles", "Write files into the live workspace", "sessions",
                   {200: reply("What was written", {
                       "type": "object", "required": ["files"], "properties": {"files": {
                           "type": "array", "items": obj({"path": STR, "size": INT}, ("path", "size"))}}})},
                   errors=(400, 404, 413, 500, 503, 507), params=[SID],
                   request=body(obj({
                       "files": {"type": "array", "minItems": 1, "maxItems": 1000, "items": obj({
                           "path": {**STR, "description": "relative to `targetPath`; no `..`, not absolute"},
                           "content": {**STR, "description": "UTF-8 text, or base64 with `encoding: base64` "
                                                             "(base64 without `encoding`, as the reference's "
                                                             "clients send it, is recognised)"},
                           "encoding": {"type": "string", "enum": ["base64", "utf-8"]},
                           "mimeType": STR}, ("path", "content"))},
                       "targetPath": {**STR, "default": ".", "description": "workspace directory to write under"}},
                       ("files",))),
                   description="The session must be `active` (a sandbox that died is brought back first). Files "
                               "belong to the sandbox user; an existing file is replaced, never written through "
                               "a link; a link or file on the way is 400. 507: the sandbox's disk quota is "
                               "full (files written before stay)."),
    },
    "/api/sessions/{id}/attachments": {
        "post": op("uploadAttachment", "Attach a file to the session (base64), for a message to name",
                   "attachments", {201: reply("Stored; `Location` is its download URL",
                                              wrapped("attachment", ref("Attachment")))},
                   errors=(400, 404, 409, 413, 507), params=[SID], request=body(ref("UploadAttachmentRequest")),
                   description="Kept in the database (any coordinator serves it) until deleted or the session is "
                               "purged; it counts towards the tenant's storage (409 when that is full). 413: over "
                               "SERVICE_ATTACHMENT_MAX_MB (10 MiB by default). A message names it in "
                               "`attachments`: see SendMessageRequest."),
        "get": op("listAttachments", "List the session's attachments", "attachments",
                  {200: reply("Attachments, oldest first", wrapped("attachments", ref("Attachment"), many=True))},
                  errors=(404,), params=[SID]),
    },
    "/api/sessions/{id}/files/{path}": {
        "get": op("getSessionFile", "Download one workspace file", "sessions", {200: {
            "description": "raw bytes (default) with Content-Type, Content-Disposition, Content-Length and "
                           "X-Service-Source; or JSON with format=json",
            "headers": {"X-Service-Source": {"schema": {"type": "string", "enum": ["sandbox", "snapshot"]}}},
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                        "application/json": {"schema": ref("FileContent")}},
        }}, errors=(400, 404), params=[
            SID, path_param("path", "file path relative to the workspace (may contain `/`)"),
            query("format", {"type": "string", "enum": ["raw", "json"], "default": "raw"},
                  "`raw` up to 100 MB; `json` UTF-8 text up to 1 MB")]),
    },
}
