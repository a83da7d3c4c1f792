"""Recording a turn: typed events derived from frames, sequence numbers from a reserved block,
writes batched off the hot path and durable before `done` is sent.

Every SSE frame (`message`, `error`, `done`) is one stored row whose sequence is the frame's SSE
`id:`. When a frame also maps to typed events (text, tool_start, ...), the first typed event shares
that row; further typed events get rows of their own. Frames that map to no typed event (`done`)
are stored with type `frame`, which `GET .../events` does not list. `stream_event` partials are
live only: they carry no id and are not stored.

Bounds (`TurnLimits`): a turn stores at most so many events and bytes. The frame that would pass
either bound is refused with `TurnLimitReached` before it gets an id; the caller stops the turn and
sends an `error` frame, then `done` (both always stored: they are small and say what happened).
Pending frames are therefore bounded too, which bounds the memory held while storage is failing.

A full disk (or an unreachable database) mid-turn: the frames already sent stay pending and are
retried; `done` waits up to `retry_seconds` for them to be stored, so a disk that gets room again
meanwhile loses nothing. Past that, `done()` reports the ids it could not store (`Done.unstored`)
and the caller tells the client which frames are missing instead of claiming the turn is stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ashd.errors import StorageError
from ashd.storage import EventRecord, ModelCallRecord, Session, Sessions, TurnUsage

log = logging.getLogger(__name__)
T = TypeVar("T")
EVENT_BLOCK = 64  # event ids reserved at a time (the first block with the turn's user message)
_FLUSH_INTERVAL = 0.05
_FLUSH_EVENTS = 128
_RETRY_FIRST, _RETRY_MAX = 0.1, 2.0


@dataclass(frozen=True)
class TurnLimits:
    max_bytes: int
    max_events: int
    retry_seconds: float = 30.0


UNLIMITED = TurnLimits(max_bytes=1 << 62, max_events=1 << 62)


class TurnLimitReached(Exception):
    """The next frame would take the turn past one of its bounds; `message` says which, for people."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Done:
    sequence: int | None  # None: the `done` frame itself could not be stored
    raw: str
    unstored: tuple[int, ...] = ()  # ids of frames sent to the client that are not in storage


async def retrying(op: Callable[[], Awaitable[T]], seconds: float, what: str, session_id: str) -> T:
    """Run `op`, retrying while storage is full or unreachable, for at most `seconds` overall."""
    deadline = time.monotonic() + seconds
    pause = _RETRY_FIRST
    while True:
        try:
            return await op()
        except StorageError as exc:
            if exc.status_code < 500 or time.monotonic() + pause > deadline:
                raise
            log.warning("%s failed (%s); retrying", what, exc.message, extra={"sessionId": session_id})
        await asyncio.sleep(pause)
        pause = min(pause * 2, _RETRY_MAX)


def is_compaction(data: dict[str, Any]) -> bool:
    """The engine's record of a compacted conversation (the Agent SDK's `compact_boundary`)."""
    return data.get("type") == "system" and data.get("subtype") == "compact_boundary"


def typed_events(data: dict[str, Any], tool_names: dict[str, str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The typed events a frame becomes. `tool_names` maps the ids of the turn's tool calls to their
    names: a tool_result block carries only the id, and its event names the tool."""
    names = {} if tool_names is None else tool_names
    kind = data.get("type")
    out: list[tuple[str, dict[str, Any]]] = []
    if kind == "assistant":
        for block in (data.get("message") or {}).get("content") or []:
            btype = block.get("type") if isinstance(block, dict) else None
            if btype == "text":
                out.append(("text", {"text": block.get("text", "")}))
            elif btype == "tool_use":
                if isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
                    names[block["id"]] = block["name"]
                out.append(("tool_start", {"toolName": block.get("name"), "toolId": block.get("id"),
                                           "input": block.get("input")}))
            elif btype in ("thinking", "redacted_thinking"):
                out.append(("reasoning", {"thinking": block.get("thinking", "")}))
    elif kind == "user":
        content = (data.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                tool_id = block.get("tool_use_id")
                name = block.get("name") or data.get("tool_name") or (
                    names.get(tool_id) if isinstance(tool_id, str) else None)
                out.append(("tool_result", {"toolName": name,
                                            "toolId": block.get("tool_use_id"), "content": block.get("content"),
                                            "isError": bool(block.get("is_error"))}))
    elif is_compaction(data):
        compaction = data.get("compaction") or {}
        out.append(("compaction", {"trigger": (data.get("compact_metadata") or {}).get("trigger"),
                                   "preTokens": (data.get("compact_metadata") or {}).get("pre_tokens"),
                                   "postTokens": compaction.get("postTokens"),
                                   "summarisedMessages": compaction.get("summarisedMessages"),
                                   "keptMessages": compaction.get("keptMessages"),
                                   "keptToolUseIds": compaction.get("keptToolUseIds"),
                                   "summary": compaction.get("summary")}))
    elif kind == "result":
        out.append(("turn_complete", {"numTurns": data.get("num_turns"), "result": data.get("result"),
                                      "usage": data.get("usage"), "isError": bool(data.get("is_error"))}))
    return out


class TurnRecorder:
    def __init__(self, sessions: Sessions, session_id: str, tenant: str, limits: TurnLimits = UNLIMITED,
                 first_event: int | None = None) -> None:
        self._sessions = sessions
        self.session_id = session_id
        self.tenant = tenant
        self.limits = limits
        self.counted_bytes = 0  # an upper bound of what this turn stores (see `_account`)
        self.counted_events = 0
        # The reserved block of event ids, [_next, _end): the first one comes with the user message.
        self._next = first_event or 0
        self._end = self._next + EVENT_BLOCK if first_event is not None else 0
        self._messages: list[tuple[str, str]] = []
        self._events: list[EventRecord] = []
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.last_sequence = 0
        self.result: dict[str, Any] | None = None
        self.tool_calls = 0
        self._tool_names: dict[str, str] = {}
        self._usage: TurnUsage | None = None  # given to `done`: stored with the last batch
        self._calls: list[ModelCallRecord] = []  # the same
        self.final_row: Session | None = None  # the session's row as the batch with `done` left it

    async def _seq(self) -> int:
        if self._next >= self._end:
            self._next = await retrying(lambda: self._sessions.reserve_events(self.session_id, EVENT_BLOCK),
                                        self.limits.retry_seconds, "reserving event ids", self.session_id)
            self._end = self._next + EVENT_BLOCK
        seq = self._next
        self._next += 1
        return seq

    async def message(self, data: dict[str, Any], raw: str) -> int | None:
        """Record a bridge `message`; returns the SSE id, or None for live-only partials."""
        kind = data.get("type")
        if kind == "stream_event":
            return None
        derived = typed_events(data, self._tool_names)
        self._account(raw, kind, len(derived))
        if kind in ("assistant", "result") or is_compaction(data):
            # A compaction is kept with the messages: a cold resume rebuilds the model's view from them.
            self._messages.append(("assistant", raw))
        elif kind == "user":
            self._messages.append(("user", raw))
        if kind == "result":
            self.result = data
        self.tool_calls += sum(1 for t, _ in derived if t == "tool_start")
        seq = await self._seq()
        first_type, first_data = derived[0] if derived else ("frame", None)
        self._events.append(EventRecord(seq, first_type, first_data, "message", raw))
        for etype, edata in derived[1:]:
            self._events.append(EventRecord(await self._seq(), etype, edata))
        self._kick()
        return seq

    def _account(self, raw: str, kind: Any, typed: int) -> None:
        """Count a frame against the turn's bounds, or refuse it. Its JSON is stored as the frame,
        again as the message row (assistant/user/result) and, cut into pieces, as typed events, so
        three times its size bounds what it costs."""
        size = len(raw.encode())
        cost = size * (3 if kind in ("assistant", "result", "user") else 2)
        rows = max(1, typed)
        if self.counted_events + rows > self.limits.max_events:
            raise TurnLimitReached(
                f"This turn was stopped: it reached the limit of {self.limits.max_events} stored events per "
                "turn (SERVICE_TURN_MAX_EVENTS). What came before is stored; send a new message to go on")
        if self.counted_bytes + cost > self.limits.max_bytes:
            raise TurnLimitReached(
                f"This turn was stopped: it reached the limit of {self.limits.max_bytes // (1024 * 1024)} MiB "
                "stored per turn (SERVICE_TURN_MAX_STORED_MB). What came before is stored; send a new "
                "message to go on")
        self.counted_events += rows
        self.counted_bytes += cost

    async def error(self, message: str, *, counted: bool = False, limit: str | None = None) -> tuple[int, str]:
        """Record an `error` frame. The server's own (why a turn ended) are never refused; the
        bridge's, and the sandbox limits it hit (`limit`: memory, pids, disk), are `counted`, since a
        sandbox could otherwise cause them without end."""
        data = {"error": message} if limit is None else {"error": message, "limit": limit}
        raw = json.dumps(data)
        if counted:
            self._account(raw, "error", 1)
        seq = await self._seq()
        self._events.append(EventRecord(seq, "error", data, "error", raw))
        self._kick()
        return seq, raw

    async def done(self, usage: TurnUsage | None = None, calls: Sequence[ModelCallRecord] = ()) -> Done:
        """Store the `done` frame and flush everything, retrying while storage is full or away;
        `usage` (what the turn used) and `calls` (the records of its model calls, with their usage
        events) go in the same transaction.

        With `Done.unstored` empty the turn is durable when this returns. Otherwise those frames
        (ids the client has seen) could not be stored in `retry_seconds` and are dropped: keeping
        them in memory would hold the turn, the session and its memory hostage to the disk.
        """
        self._usage = usage
        self._calls.extend(calls)
        raw = json.dumps({"sessionId": self.session_id})
        try:
            seq: int | None = await self._seq()
        except StorageError:
            seq = None
        if seq is not None:
            self._events.append(EventRecord(seq, "frame", None, "done", raw))
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        # When even the `done` id could not be reserved, storage has been failing for a whole retry
        # window already: one more attempt, not a second window.
        window = self.limits.retry_seconds if seq is not None else 0.0
        try:
            await retrying(self.flush, window, "storing the end of a turn", self.session_id)
        except StorageError:
            unstored = tuple(e.sequence for e in self._events if e.frame_event is not None and e.sequence != seq)
            log.error("a turn's last frames could not be stored: the disk stayed full or the database away",
                      extra={"sessionId": self.session_id, "frames": len(unstored),
                             "messages": len(self._messages)})
            self._events, self._messages, self._usage = [], [], None  # the calls: `unstored_calls`
            return Done(None, raw, unstored)
        return Done(seq, raw)

    def unstored_calls(self) -> list[ModelCallRecord]:
        """The model call records given to `done` that are not stored (its batch failed, or never ran),
        taken out: the caller hands them back to the writer they came from, which stores them on its
        own (a call is paid for, whatever became of the turn)."""
        calls, self._calls = self._calls, []
        return calls

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
            try:
                await self.flush()
            except Exception:  # noqa: BLE001 - logged in flush; the batch stays pending for done()
                return

        if self._flusher is None or delay == 0.0:
            self._flusher = asyncio.get_running_loop().create_task(run())

    async def flush(self) -> None:
        async with self._lock:
            messages, events, usage, calls = self._messages, self._events, self._usage, self._calls
            self._messages, self._events, self._usage, self._calls = [], [], None, []
            if not messages and not events and usage is None and not calls:
                return
            try:
                row = await asyncio.shield(self._sessions.store_turn_batch(self.session_id, self.tenant, messages,
                                                                           events, usage, calls))
            except Exception as exc:
                # Put them back so the final flush retries; a failure here must not lose the turn.
                self._messages[:0], self._events[:0], self._calls[:0] = messages, events, calls
                self._usage = usage
                if isinstance(exc, StorageError):  # full disk, database away: expected, said once
                    log.warning("storing a turn batch failed (%s); will retry", exc.message,
                                extra={"sessionId": self.session_id})
                else:
                    log.exception("storing a turn batch failed; will retry", extra={"sessionId": self.session_id})
                raise
            if events:
                self.last_sequence = max(self.last_sequence, events[-1].sequence)
            if row is not None:
                self.final_row = row

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        await self.flush()
