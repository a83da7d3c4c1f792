"""Recording a turn: typed events derived from frames, sequence numbers from a reserved block,
writes batched off the hot path and durable before `done` is sent.

Every SSE frame (`message`, `error`, `done`) is one stored row whose sequence is the frame's SSE
`id:`. When a frame also maps to typed events (text, tool_start, ...), the first typed event shares
that row; further typed events get rows of their own. Frames that map to no typed event (`done`)
are stored with type `frame`, which `GET .../events` does not list. `stream_event` partials are
live only: they carry no id and are not stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from ashd.storage._sessions import EventRecord, Sessions

log = logging.getLogger(__name__)
_BLOCK = 64
_FLUSH_INTERVAL = 0.05
_FLUSH_EVENTS = 128


def typed_events(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = data.get("type")
    out: list[tuple[str, dict[str, Any]]] = []
    if kind == "assistant":
        for block in (data.get("message") or {}).get("content") or []:
            btype = block.get("type") if isinstance(block, dict) else None
            if btype == "text":
                out.append(("text", {"text": block.get("text", "")}))
            elif btype == "tool_use":
                out.append(("tool_start", {"toolName": block.get("name"), "toolId": block.get("id"),
                                           "input": block.get("input")}))
            elif btype in ("thinking", "redacted_thinking"):
                out.append(("reasoning", {"thinking": block.get("thinking", "")}))
    elif kind == "user":
        content = (data.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out.append(("tool_result", {"toolName": block.get("name") or data.get("tool_name"),
                                            "toolId": block.get("tool_use_id"), "content": block.get("content"),
                                            "isError": bool(block.get("is_error"))}))
    elif kind == "result":
        out.append(("turn_complete", {"numTurns": data.get("num_turns"), "result": data.get("result"),
                                      "usage": data.get("usage"), "isError": bool(data.get("is_error"))}))
    return out


class TurnRecorder:
    def __init__(self, sessions: Sessions, session_id: str, tenant: str) -> None:
        self._sessions = sessions
        self.session_id = session_id
        self.tenant = tenant
        self._next = 0
        self._end = 0  # exclusive end of the reserved block
        self._messages: list[tuple[str, str]] = []
        self._events: list[EventRecord] = []
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.last_sequence = 0
        self.result: dict[str, Any] | None = None
        self.tool_calls = 0

    async def _seq(self) -> int:
        if self._next >= self._end:
            self._next = await self._sessions.reserve_events(self.session_id, _BLOCK)
            self._end = self._next + _BLOCK
        seq = self._next
        self._next += 1
        return seq

    async def message(self, data: dict[str, Any], raw: str) -> int | None:
        """Record a bridge `message`; returns the SSE id, or None for live-only partials."""
        kind = data.get("type")
        if kind == "stream_event":
            return None
        if kind in ("assistant", "result"):
            self._messages.append(("assistant", raw))
        elif kind == "user":
            self._messages.append(("user", raw))
        if kind == "result":
            self.result = data
        derived = typed_events(data)
        self.tool_calls += sum(1 for t, _ in derived if t == "tool_start")
        seq = await self._seq()
        first_type, first_data = derived[0] if derived else ("frame", None)
        self._events.append(EventRecord(seq, first_type, first_data, "message", raw))
        for etype, edata in derived[1:]:
            self._events.append(EventRecord(await self._seq(), etype, edata))
        self._kick()
        return seq

    async def error(self, message: str) -> tuple[int, str]:
        raw = json.dumps({"error": message})
        seq = await self._seq()
        self._events.append(EventRecord(seq, "error", {"error": message}, "error", raw))
        self._kick()
        return seq, raw

    async def done(self) -> tuple[int, str]:
        """Store the `done` frame and flush everything: the turn is durable when this returns."""
        raw = json.dumps({"sessionId": self.session_id})
        seq = await self._seq()
        self._events.append(EventRecord(seq, "frame", None, "done", raw))
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        await self.flush()
        return seq, raw

    def _kick(self) -> None:
        if len(self._events) >= _FLUSH_EVENTS:
            self._spawn_flush(0.0)
        elif self._flusher is None:
            self._spawn_flush(_FLUSH_INTERVAL)

    def _spawn_flush(self, delay: float) -> None:
        async def run() -> None:
            if delay:
                await asyncio.sleep(delay)
            self._flusher = None
            await self.flush()

        if self._flusher is None or delay == 0.0:
            self._flusher = asyncio.get_running_loop().create_task(run())

    async def flush(self) -> None:
        async with self._lock:
            messages, events = self._messages, self._events
            self._messages, self._events = [], []
            if not messages and not events:
                return
            try:
                await asyncio.shield(self._sessions.store_turn_batch(self.session_id, self.tenant, messages, events))
            except Exception:
                # Put them back so the final flush retries; a failure here must not lose the turn.
                self._messages[:0], self._events[:0] = messages, events
                log.exception("storing a turn batch failed; will retry", extra={"sessionId": self.session_id})
                raise
            if events:
                self.last_sequence = max(self.last_sequence, events[-1].sequence)
            self._changed.set()
            self._changed = asyncio.Event()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        await self.flush()

    def changed(self) -> asyncio.Event:
        return self._changed
