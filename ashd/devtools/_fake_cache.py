"""The fake's prompt cache: `cache_control` breakpoints write prefixes that later requests read.

Like the real API, a request's prefix runs tools → system → messages, each marked block ends a
prefix that is written to the cache, and the longest marked prefix seen before is read back. Sizes
are the fake's usual estimate (characters / 4); the split is clamped to the request's input tokens,
so `input + cache_creation + cache_read` is what the request would have cost uncached. More than
four breakpoints are refused with the API's own 400.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

MAX_BREAKPOINTS = 4
UNCACHED_TAIL = 4
_sorted_json = json.JSONEncoder(sort_keys=True).encode  # built once: `json.dumps(sort_keys=...)` builds one a call


def flat_blocks(body: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(block without its mark, marked?) in prefix order."""
    out: list[tuple[Any, bool]] = []

    def add(prefix: str, block: Any) -> None:
        if isinstance(block, dict) and "cache_control" in block:
            out.append(([prefix, {k: v for k, v in block.items() if k != "cache_control"}], True))
        else:
            out.append(([prefix, block], False))

    for tool in body.get("tools") or []:
        add("tool", tool)
    system = body.get("system")
    for block in system if isinstance(system, list) else ([system] if system else []):
        add("system", block)
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        role = str(message.get("role")) if isinstance(message, dict) else ""
        for block in content if isinstance(content, list) else [content]:
            add(role, block)
    return out


def count_breakpoints(body: dict[str, Any], blocks: list[tuple[Any, bool]] | None = None) -> int:
    return sum(1 for _, marked in (flat_blocks(body) if blocks is None else blocks) if marked)


class PromptCache:
    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def account(self, body: dict[str, Any], input_tokens: int,
                blocks: list[tuple[Any, bool]] | None = None) -> tuple[int, int, int]:
        """(input, cache_creation, cache_read) tokens for this request; remembers its prefixes.
        `blocks`: the request's `flat_blocks`, when the caller has them already."""
        # A mark's key hashes its prefix as one JSON list of the blocks (without their marks) up to
        # and including it, fed in a piece per mark: one encoding per mark, not one per block (2.0
        # → 1.0 ms a request at 200 KiB of conversation, 800 blocks). Its size counts the blocks' own
        # characters, as the API's counts their tokens.
        digest = hashlib.sha256()
        marks: list[tuple[str, int]] = []
        pending: list[Any] = []
        blocks_in, chars = 0, 0
        for block, marked in flat_blocks(body) if blocks is None else blocks:
            pending.append(block)
            if not marked:
                continue
            inner = _sorted_json(pending)[1:-1]  # the blocks, each as its own encoding, ", " between
            digest.update((", " + inner if blocks_in else "[" + inner).encode())
            blocks_in += len(pending)
            chars += len(inner) - 2 * (len(pending) - 1)
            pending = []
            marks.append((digest.hexdigest(), chars // 4))
        if not marks:
            return input_tokens, 0, 0
        with self._lock:
            read = max((tokens for key, tokens in marks if key in self._seen), default=0)
            self._seen.update(key for key, _ in marks)
        # Like the API, a few tokens after the last mark (the prompt's closing) are never cached.
        cacheable = max(0, input_tokens - UNCACHED_TAIL)
        longest = marks[-1][1]
        read = min(read, cacheable)
        created = min(max(0, longest - read), cacheable - read)
        return input_tokens - read - created, created, read
