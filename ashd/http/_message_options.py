"""The per-message options of POST /api/sessions/{id}/messages (the published client's wire names):
`maxTurns`, `effort`, `thinking`, `outputFormat`. Checked here, then handed to the bridge in the
`query` frame (docs/protocol.md), in the shapes the engines use."""

from __future__ import annotations

import json
from typing import Any

from ashd.errors import BadRequest
from ashd.model_names import MIN_THINKING_BUDGET, THINKING_REPLY_TOKENS

MAX_TURNS_LIMIT = 1000
EFFORTS = ("low", "medium", "high", "max")
THINKING_TYPES = ("enabled", "disabled", "adaptive")
MAX_THINKING_BUDGET = 128_000
MAX_SCHEMA_CHARS = 100_000


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def max_turns(body: dict[str, Any]) -> int | None:
    value = body.get("maxTurns")
    if value is None:
        return None
    if not _int(value) or not 1 <= value <= MAX_TURNS_LIMIT:
        raise BadRequest(f"`maxTurns` must be an integer from 1 to {MAX_TURNS_LIMIT} (model turns of this message)")
    return int(value)


def effort(body: dict[str, Any]) -> str | None:
    value = body.get("effort")
    if value is None:
        return None
    if value not in EFFORTS:
        raise BadRequest(f"`effort` must be one of {', '.join(EFFORTS)}")
    return str(value)


def thinking(body: dict[str, Any], max_tokens_ceiling: int | None) -> dict[str, Any] | None:
    """`{type, budgetTokens?}` → the Messages API's `{type, budget_tokens?}`."""
    value = body.get("thinking")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("`thinking` must be an object {type, budgetTokens}")
    unknown = sorted(set(value) - {"type", "budgetTokens"})
    if unknown:
        raise BadRequest(f"`thinking` has unknown field(s) {', '.join(unknown)}: it takes `type` and `budgetTokens`")
    kind = value.get("type")
    if kind not in THINKING_TYPES:
        raise BadRequest(f"`thinking.type` must be one of {', '.join(THINKING_TYPES)}")
    budget = value.get("budgetTokens")
    if kind != "enabled":
        if budget is not None:
            raise BadRequest(f"`thinking.budgetTokens` goes with `type: enabled` only, not `{kind}`")
        return {"type": kind}
    top = MAX_THINKING_BUDGET
    if max_tokens_ceiling is not None:
        top = min(top, max_tokens_ceiling - THINKING_REPLY_TOKENS)
    if top < MIN_THINKING_BUDGET:
        raise BadRequest(f"`thinking` cannot be enabled on this server: its max_tokens ceiling "
                         f"(SERVICE_MODEL_MAX_TOKENS={max_tokens_ceiling}) leaves no room for a thinking budget of "
                         f"{MIN_THINKING_BUDGET} tokens plus {THINKING_REPLY_TOKENS} for the reply")
    if not isinstance(budget, int) or isinstance(budget, bool) or not MIN_THINKING_BUDGET <= budget <= top:
        why = (f" (the server's max_tokens ceiling SERVICE_MODEL_MAX_TOKENS={max_tokens_ceiling} minus "
               f"{THINKING_REPLY_TOKENS} tokens kept for the reply)" if top < MAX_THINKING_BUDGET else "")
        raise BadRequest(f"`thinking.budgetTokens` is required with `type: enabled`: an integer from "
                         f"{MIN_THINKING_BUDGET} to {top}{why}")
    return {"type": "enabled", "budget_tokens": int(budget)}


def output_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`{type: "json_schema", schema}`: the schema must be a valid JSON Schema."""
    value = body.get("outputFormat")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("`outputFormat` must be an object {type: \"json_schema\", schema}")
    unknown = sorted(set(value) - {"type", "schema"})
    if unknown:
        raise BadRequest(f"`outputFormat` has unknown field(s) {', '.join(unknown)}: it takes `type` and `schema`")
    if value.get("type") != "json_schema":
        raise BadRequest("`outputFormat.type` must be \"json_schema\"")
    schema = value.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest("`outputFormat.schema` must be a JSON Schema object")
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise BadRequest(f"`outputFormat.schema` is larger than {MAX_SCHEMA_CHARS} characters")
    from jsonschema import exceptions, validators  # type: ignore[import-untyped]

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise BadRequest(f"`outputFormat.schema` is not a valid JSON Schema{f' (at {where})' if where else ''}: "
                         f"{exc.message}") from exc
    return {"type": "json_schema", "schema": schema}


def query_options(body: dict[str, Any], max_tokens_ceiling: int | None) -> dict[str, Any]:
    """The options as the `query` frame's fields (docs/protocol.md); absent ones left out."""
    options = {
        "maxTurns": max_turns(body),
        "effort": effort(body),
        "thinking": thinking(body, max_tokens_ceiling),
        "outputFormat": output_format(body),
    }
    return {k: v for k, v in options.items() if v is not None}
