"""Prompt caching: where a request's cache breakpoints go.

The Messages API caches the prefix of a request (tools, then system, then messages) up to each
block marked with `cache_control`, and allows at most four marks per request. The engine spends
them on what repeats from call to call:

1. the last tool definition (the tools change only when the session's MCP servers do),
2. the system prompt,
3. the last block of the conversation: the next call, which extends this one, reads it back,
4. the last block of the user turn before it: the prefix the previous call wrote. A lookup only
   walks back about 20 blocks from a mark, so without this one a turn that added many blocks
   (parallel tool results) would miss the cache the previous call wrote.

The conversation itself is never changed: marks go on copies of the blocks they touch, so what
the engine keeps, emits and the service stores carries no `cache_control`.
"""

from __future__ import annotations

from typing import Any

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
# Blocks the API refuses a cache_control on (and empty text, which it refuses outright).
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def cached_system(system: str | None) -> list[dict[str, Any]] | None:
    if not system:
        return None
    return [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]


def cached_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not tools:
        return tools
    return [*tools[:-1], {**tools[-1], "cache_control": dict(EPHEMERAL)}]


def cached_messages(messages: list[dict[str, Any]], marks: int = 2) -> list[dict[str, Any]]:
    """A shallow copy of `messages` with `marks` breakpoints: on the last message, then on the
    user turns before it (the one before the last, and so on)."""
    out = list(messages)
    placed = 0
    for i in range(len(out) - 1, -1, -1):
        if placed >= marks:
            break
        if i != len(out) - 1 and out[i].get("role") != "user":
            continue
        marked = _mark_last_block(out[i])
        if marked is not None:
            out[i] = marked
            placed += 1
    return out


def _mark_last_block(message: dict[str, Any]) -> dict[str, Any] | None:
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        return {**message, "content": [{"type": "text", "text": content, "cache_control": dict(EPHEMERAL)}]}
    if not isinstance(content, list):
        return None
    for j in range(len(content) - 1, -1, -1):
        block = content[j]
        if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        blocks = list(content)
        blocks[j] = {**block, "cache_control": dict(EPHEMERAL)}
        return {**message, "content": blocks}
    return None

