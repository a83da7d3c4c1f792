"""Helpers that keep the OpenAPI path literals short: operations, bodies, responses, errors."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_schemas import Schema, ref

Operation = dict[str, Any]

_ERROR_TEXT = {
    400: "Bad request: the message says what to fix",
    401: "Missing or invalid API key (or internal secret)",
    404: "Not found (or another tenant's record)",
    409: "Conflict with the current state, or a tenant limit reached (a count, or its storage total: "
         "GET /api/storage shows what it holds)",
    410: "Gone: the session has ended",
    413: "Too large: the request body, an uploaded agent, or a workspace over the snapshot limit",
    429: "Rate limit exceeded; see Retry-After",
    500: "Internal or sandbox failure",
    503: "Capacity reached, no runner available, a component did not answer, or the database is unreachable",
    507: "The server's data disk is full (or below its reserve): nothing stored was lost, reads keep working; "
         "retry once space is freed",
}


def json_content(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def body(schema: Schema, *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": json_content(schema)}


def reply(description: str, schema: Schema | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    if schema is not None:
        out["content"] = json_content(schema)
    return out


def wrapped(key: str, schema: Schema, *, many: bool = False) -> Schema:
    """`{key: schema}` or `{key: [schema]}`: the API's response envelopes."""
    inner = {"type": "array", "items": schema} if many else schema
    return {"type": "object", "properties": {key: inner}, "required": [key]}


def op(op_id: str, summary: str, tag: str, responses: dict[int | str, Any], *, errors: tuple[int, ...] = (),
       request: dict[str, Any] | None = None, params: list[dict[str, Any]] | None = None,
       security: list[dict[str, list[str]]] | None = None, description: str | None = None) -> Operation:
    out: Operation = {"operationId": op_id, "summary": summary, "tags": [tag]}
    if description:
        out["description"] = description
    if params:
        out["parameters"] = params
    if request is not None:
        out["requestBody"] = request
    all_responses: dict[str, Any] = {str(code): resp for code, resp in responses.items()}
    codes = set(errors)
    if security != []:
        codes |= {401, 429} if security is None else {401}
    for code in sorted(codes):
        all_responses[str(code)] = {"$ref": f"#/components/responses/E{code}"}
    out["responses"] = all_responses
    if security is not None:
        out["security"] = security
    return out


def path_param(name: str, description: str, *, fmt: str | None = None) -> dict[str, Any]:
    schema: Schema = {"type": "string"}
    if fmt:
        schema["format"] = fmt
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def query(name: str, schema: Schema, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def error_responses() -> dict[str, Any]:
    return {f"E{code}": reply(text, ref("ApiError")) for code, text in _ERROR_TEXT.items()}


PUBLIC: list[dict[str, list[str]]] = []
INTERNAL: list[dict[str, list[str]]] = [{"internalSecret": []}]
