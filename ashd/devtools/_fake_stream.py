"""Rendering a scripted turn as a Messages API response: SSE events or one JSON message."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

# A request's input tokens as (uncached, cache_creation, cache_read).
Tokens = tuple[int, int, int]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str, error_type: str | None = None) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": error_type or _ERROR_TYPES.get(status, "api_error"), "message": message},
    }


def _blocks(turn: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = []
    for raw in turn.get("content") or []:
        block = dict(raw)
        if block.get("type") == "tool_use":
            block.setdefault("id", f"toolu_{uuid.uuid4().hex[:24]}")
            block.setdefault("input", {})
        if block.get("type") == "thinking":
            block.setdefault("signature", f"sig_{uuid.uuid4().hex[:16]}")
        blocks.append(block)
    return blocks


def _usage(turn: dict[str, Any], tokens: int | Tokens, blocks: list[dict[str, Any]]) -> dict[str, int]:
    produced = sum(len(json.dumps(b)) for b in blocks)
    # A turn that scripts its usage scripts all of it: the simulated cache stays out of the way.
    split = (tokens, 0, 0) if isinstance(tokens, int) else tokens
    uncached, created, read = split if not turn.get("usage") else (sum(split), 0, 0)
    usage = {
        "input_tokens": uncached,
        "output_tokens": max(1, produced // 4),
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
    }
    usage.update({k: int(v) for k, v in (turn.get("usage") or {}).items()})
    return usage


def _stop_reason(turn: dict[str, Any], blocks: list[dict[str, Any]]) -> str:
    if turn.get("stop_reason"):
        return str(turn["stop_reason"])
    return "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"


def full_message(turn: dict[str, Any], model: str, tokens: int | Tokens) -> dict[str, Any]:
    blocks = _blocks(turn)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": _stop_reason(turn, blocks),
        "stop_sequence": None,
        "usage": _usage(turn, tokens, blocks),
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def sse_events(turn: dict[str, Any], model: str, tokens: int | Tokens) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs exactly as the real API streams them."""
    msg = full_message(turn, model, tokens)
    chunk = max(1, int(turn.get("chunk") or 8))
    usage = msg["usage"]
    start = dict(msg, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(msg["content"]):
        kind = block.get("type")
        if kind == "text":
            yield "content_block_start", _start(index, {"type": "text", "text": ""})
            for piece in _pieces(block.get("text", ""), chunk):
                yield "content_block_delta", _delta(index, {"type": "text_delta", "text": piece})
        elif kind == "thinking":
            yield "content_block_start", _start(index, {"type": "thinking", "thinking": "", "signature": ""})
            for piece in _pieces(block.get("thinking", ""), chunk):
                yield "content_block_delta", _delta(index, {"type": "thinking_delta", "thinking": piece})
            yield (
                "content_block_delta",
                _delta(index, {"type": "signature_delta", "signature": block["signature"]}),
            )
        elif kind == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield "content_block_start", _start(index, head)
            for piece in _pieces(json.dumps(block["input"]), chunk * 4):
                yield (
                    "content_block_delta",
                    _delta(index, {"type": "input_json_delta", "partial_json": piece}),
                )
        else:
            yield "content_block_start", _start(index, block)
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}
