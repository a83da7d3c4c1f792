"""Builders for the Agent SDK raw stream-json message shapes the bridge emits."""

from __future__ import annotations

import uuid
from typing import Any

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def new_uuid() -> str:
    return str(uuid.uuid4())


def assistant(message: dict[str, Any], session_id: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": message,
        "parent_tool_use_id": parent,
        "session_id": session_id,
        "uuid": new_uuid(),
    }


def user_tool_results(blocks: list[dict[str, Any]], session_id: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {"role": "user", "content": blocks},
        "parent_tool_use_id": parent,
        "session_id": session_id,
        "uuid": new_uuid(),
    }


def stream_event(event: dict[str, Any], session_id: str, parent: str | None) -> dict[str, Any]:
    return {
        "type": "stream_event",
        "event": event,
        "session_id": session_id,
        "parent_tool_use_id": parent,
        "uuid": new_uuid(),
    }


def text_of(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text")


def add_usage(total: dict[str, int], usage: dict[str, Any] | None) -> None:
    for key in USAGE_KEYS:
        total[key] = total.get(key, 0) + int((usage or {}).get(key) or 0)


def empty_usage() -> dict[str, int]:
    return dict.fromkeys(USAGE_KEYS, 0)


def append_user(messages: list[dict[str, Any]], content: str | list[dict[str, Any]]) -> None:
    """Append a user turn, merging into a trailing user turn (e.g. tool results left by max_turns)."""
    if messages and messages[-1].get("role") == "user":
        prev = messages[-1]["content"]
        blocks = [{"type": "text", "text": prev}] if isinstance(prev, str) else list(prev)
        blocks += [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        messages[-1] = {"role": "user", "content": blocks}
    else:
        messages.append({"role": "user", "content": content})


def compact_boundary(
    session_id: str, parent: str | None, trigger: str, pre_tokens: int, compaction: dict[str, Any]
) -> dict[str, Any]:
    """The Agent SDK's `compact_boundary` system message, plus what the engine kept (`compaction`:
    summary, summarisedMessages, keptMessages, keptToolUseIds, postTokens)."""
    return {
        "type": "system",
        "subtype": "compact_boundary",
        "compact_metadata": {"trigger": trigger, "pre_tokens": pre_tokens},
        "compaction": compaction,
        "parent_tool_use_id": parent,
        "session_id": session_id,
        "uuid": new_uuid(),
    }
