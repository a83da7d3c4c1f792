"""Reads the usage the model API reports out of a reply as it passes through the proxy.

The proxy forwards every chunk as soon as it arrives and feeds a copy here; nothing waits for
the meter. Streamed replies (`text/event-stream`) are parsed event by event, keeping only the
unfinished line: `message_start` carries the input and cache tokens, each `message_delta` the
running totals (output tokens; newer API versions repeat the input fields there). JSON replies
(one message, or an error body) are kept up to `JSON_CAP` bytes and parsed at the end.
"""

from __future__ import annotations

import json
import math
from typing import Any

USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
JSON_CAP = 32 * 1024 * 1024  # a Messages API reply is far smaller; past this the body is not metered
_LINE_CAP = 4 * 1024 * 1024  # an SSE line this long is no usage event: dropped, not buffered
_EVENTS = frozenset({b"message_start", b"message_delta", b"error"})
_TOKEN_CAP = 10**9
# Rough characters per output token, used only when a call was abandoned mid-stream: counted low, so
# that the estimate errs on the side of more tokens.
_CHARS_PER_TOKEN = 3


def _tokens(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return min(int(value), _TOKEN_CAP)


class UsageMeter:
    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.usage: dict[str, int] = dict.fromkeys(USAGE_FIELDS, 0)
        self.started = False  # message_start seen (input tokens known)
        self.finished = False  # message_delta seen (final output tokens known)
        self.model: str | None = None
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.delta_chars = 0  # generated characters seen, for the estimate of an abandoned stream
        self._tail = b""
        self._event = b""
        self._data: list[bytes] = []
        self._body: list[bytes] = []
        self._body_len = 0
        self.overflow = False

    # -- feeding ---------------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> None:
        if not self.streaming:
            self._body_len += len(chunk)
            if self._body_len > JSON_CAP:
                self.overflow = True
                self._body = []
            elif not self.overflow:
                self._body.append(chunk)
            return
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._tail = data if len(data) <= _LINE_CAP else b""
            return
        self._tail = data[end + 1:]
        if len(self._tail) > _LINE_CAP:
            self._tail = b""
        for line in data[:end].split(b"\n"):
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line:  # blank line: dispatch the event
            if self._data:
                self._dispatch(self._event, b"\n".join(self._data))
            self._event, self._data = b"", []
        elif line.startswith(b"data:"):
            if self._event in _EVENTS or not self._event:
                self._data.append(line[5:].lstrip(b" "))
            elif self._event == b"content_block_delta":
                self.delta_chars += max(0, len(line) - 80)  # the JSON around a delta is about 80 bytes
        elif line.startswith(b"event:"):
            self._event = line[6:].strip()

    def _dispatch(self, event: bytes, data: bytes) -> None:
        if not event and b'"message_' not in data and b'"error"' not in data:
            return
        try:
            value = json.loads(data)
        except ValueError:
            return
        if isinstance(value, dict):
            self._event_value(value)

    def _event_value(self, value: dict[str, Any]) -> None:
        kind = value.get("type")
        if kind == "message_start" and isinstance(value.get("message"), dict):
            message = value["message"]
            self.started = True
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            self._merge(message.get("usage"))
        elif kind == "message_delta":
            self.finished = True
            self._merge(value.get("usage"))
        elif kind == "error":
            self._error(value.get("error"))

    def _merge(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for name in USAGE_FIELDS:
            tokens = _tokens(usage.get(name))
            if tokens is not None:
                self.usage[name] = tokens

    def _error(self, error: Any) -> None:
        if isinstance(error, dict):
            self.error_type = str(error.get("type") or "error")[:64]
            self.error_message = str(error.get("message") or "")[:500]
        else:
            self.error_type = "error"

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> None:
        """Call once the reply has ended (or was abandoned): parses a JSON body."""
        if self.streaming:
            if self._tail:
                self._line(self._tail.rstrip(b"\r"))
                self._tail = b""
            self._line(b"")
            return
        if self.overflow or not self._body:
            return
        try:
            value = json.loads(b"".join(self._body))
        except ValueError:
            return
        finally:
            self._body = []
        if not isinstance(value, dict):
            return
        if value.get("type") == "error":
            self._error(value.get("error"))
            return
        if isinstance(value.get("model"), str):
            self.model = value["model"]
        if isinstance(value.get("usage"), dict):
            self.started = self.finished = True
            self._merge(value["usage"])

    def estimated_output(self) -> int:
        """Output tokens of a stream abandoned before its final usage: at least what was reported,
        or the characters generated so far at a low characters-per-token rate."""
        return max(self.usage["output_tokens"], -(-max(0, self.delta_chars) // _CHARS_PER_TOKEN))
