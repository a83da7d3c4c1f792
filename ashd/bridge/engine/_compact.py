"""Context management: when a conversation nears the model's context window, its older part is
replaced by a summary the model writes, and the recent part is kept verbatim.

The cut always falls just before an assistant message, so the kept part starts with the model's
turn and every tool use in it keeps its result (results follow their use in the next user turn):
the open tool calls of the running query stay as they are. The summary becomes the first user
turn, followed by the user's current request verbatim when that request was in the summarised
part. Only what the model sees changes: the service stores every message as it was, and a
`compact_boundary` message records the cut so a cold resume can rebuild the same view
(`ashd.bridge.history`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Compact once the request plus the reply's max_tokens would pass this share of the window.
COMPACT_AT = 0.85
# The recent part kept verbatim: at most this share of the window (at least the last model turn).
KEEP_SHARE = 0.25
CHARS_PER_TOKEN = 4
# The summary request shows the model at most this much of any one block: the older part must
# fit the window even when a `prompt is too long` answer is what started the compaction.
SUMMARY_BLOCK_CHARS = 20_000
SUMMARY_MAX_TOKENS = 4096

SUMMARY_INSTRUCTION = (
    "Summarise the conversation above for your own later use; it will replace the conversation. "
    "Keep what is needed to go on: the user's goals and requests, decisions made, files, commands "
    "and values involved with their outcomes, errors met and how they were resolved, and what "
    "remains to be done. Be specific (names, paths, numbers). Reply with the summary only."
)
SUMMARY_HEADER = "[Earlier conversation, compacted: this summary replaces {count} earlier messages.]"
CURRENT_REQUEST = "[The user's current request, verbatim:]"


# Images and PDFs (base64 in the request) cost the model far fewer tokens than their characters:
# an image at most about this many, a PDF roughly one per this many bytes (a page is ~2-3k tokens).
IMAGE_TOKENS = 1600
PDF_BYTES_PER_TOKEN = 30


def _media_tokens(block: dict[str, Any]) -> int | None:
    source = block.get("source")
    if block.get("type") not in ("image", "document") or not isinstance(source, dict) \
            or source.get("type") != "base64":
        return None
    if block["type"] == "image":
        return IMAGE_TOKENS
    return max(IMAGE_TOKENS, len(str(source.get("data") or "")) * 3 // 4 // PDF_BYTES_PER_TOKEN)


def estimate_tokens(value: Any) -> int:
    media = 0

    def without_media(item: Any) -> Any:
        nonlocal media
        if isinstance(item, list):
            return [without_media(x) for x in item]
        if isinstance(item, dict):
            tokens = _media_tokens(item)
            if tokens is not None:
                media += tokens
                return {k: v for k, v in item.items() if k != "source"}
            return {k: without_media(v) for k, v in item.items()}
        return item

    return len(json.dumps(without_media(value), ensure_ascii=False)) // CHARS_PER_TOKEN + media


@dataclass
class Measure:
    """What the last model call said the conversation costs: `tokens` for its first `length`
    messages (the API's count, cache included). Later messages are estimated from their size."""

    length: int = 0
    tokens: int = 0

    def estimate(self, messages: list[dict[str, Any]], fixed: int) -> int:
        if 0 < self.length <= len(messages):
            return self.tokens + estimate_tokens(messages[self.length :])
        return fixed + estimate_tokens(messages)

    def record(self, messages: list[dict[str, Any]], usage: dict[str, Any] | None) -> None:
        keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
        self.length = len(messages)
        self.tokens = sum(int((usage or {}).get(k) or 0) for k in keys)

    def reset(self) -> None:
        self.length = self.tokens = 0


def needs_compaction(estimate: int, max_tokens: int, window: int) -> bool:
    return estimate + max_tokens > COMPACT_AT * window


@dataclass(frozen=True)
class Plan:
    cut: int  # messages[cut] is the first kept message (an assistant turn)
    request: str | None  # the current request, verbatim, when it falls in the summarised part


def plan(messages: list[dict[str, Any]], keep_tokens: int) -> Plan | None:
    """Where to cut: the earliest assistant turn whose suffix fits `keep_tokens`, else the last
    assistant turn. None when there is nothing before an assistant turn to summarise."""
    cuts = [i for i in range(1, len(messages)) if messages[i].get("role") == "assistant"]
    # Summarising nothing but the last summary would not make the conversation any shorter.
    if cuts and cuts[-1] == 1 and _is_summary(messages[0]):
        return None
    if not cuts:
        return None
    sizes = [estimate_tokens(msg) for msg in messages]
    suffix = 0
    fits = cuts[-1]
    tail = len(messages)
    for i in reversed(cuts):
        suffix += sum(sizes[i:tail])
        tail = i
        if suffix > keep_tokens:
            break
        fits = i
    kept = messages[fits:]
    request = None if any(_user_text(m) for m in kept) else _last_request(messages[:fits])
    return Plan(fits, request)


def _user_text(message: dict[str, Any]) -> str:
    if message.get("role") != "user":
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def _is_summary(message: dict[str, Any]) -> bool:
    return _user_text(message).startswith(SUMMARY_HEADER.split("{", 1)[0])


def _last_request(messages: list[dict[str, Any]]) -> str | None:
    for message in reversed(messages):
        text = _user_text(message)
        if text and not _is_summary(message):
            return text
    return None


def _trimmed(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    for key in ("text", "content"):
        value = block.get(key)
        if isinstance(value, str) and len(value) > SUMMARY_BLOCK_CHARS:
            cut = len(value) - SUMMARY_BLOCK_CHARS
            return {**block, key: f"{value[:SUMMARY_BLOCK_CHARS]}\n[... {cut} more characters not shown]"}
        if key == "content" and isinstance(value, list):
            return {**block, "content": [_trimmed(b) for b in value]}
    return block


def summary_request(older: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation to summarise, big blocks trimmed, ending with the instruction."""
    out: list[dict[str, Any]] = []
    for message in older:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        out.append({"role": message.get("role"), "content": [_trimmed(b) for b in blocks]})
    instruction = {"type": "text", "text": SUMMARY_INSTRUCTION}
    if out and out[-1]["role"] == "user":
        out[-1] = {"role": "user", "content": [*out[-1]["content"], instruction]}
    else:
        out.append({"role": "user", "content": [instruction]})
    return out


def summary_text(summary: str, summarised: int, request: str | None) -> str:
    text = f"{SUMMARY_HEADER.format(count=summarised)}\n\n{summary.strip()}"
    if request:
        text += f"\n\n{CURRENT_REQUEST}\n{request}"
    return text


def tool_use_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [
        str(b.get("id"))
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
