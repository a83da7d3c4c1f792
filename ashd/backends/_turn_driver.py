"""Drives one turn of a local session: the bridge's frames are recorded, bounded, counted and
handed on; the model calls and the usage are stored before `done` is handed on.

It runs in its own task (see `LocalBackend.message`): what reads the frames may go away, the turn
still finishes and is stored, and can be replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from ashd import compact_json
from ashd.actors import SendQuery, SentQuery, TurnLimitReached, TurnLimits, TurnRecorder, TurnTicket
from ashd.backends._model_turn import ModelTurn
from ashd.backends._protocol import Message
from ashd.errors import SandboxError, StorageError
from ashd.logs import emit_line
from ashd.metrics import Metrics
from ashd.sandboxing import LimitNotice, TurnSummary
from ashd.storage import Session, Sessions, TurnUsage, iso, utcnow

log = logging.getLogger(__name__)


class FrameSink(Protocol):
    async def send(self, event: str, data: str, event_id: int | None = None) -> bool: ...


@dataclass(frozen=True)
class TurnDriver:
    sessions: Sessions
    limits: TurnLimits
    metrics: Metrics
    model_proxy: Any  # ModelProxy or None
    # The sandbox's exit, once its process is reaped (None while it runs): why a connection broke.
    exit_info: Callable[[str], Awaitable[Any]]
    debug_timing: bool = False
    # Told (tenant, the event data's maker) once a turn's `done` is sent: the webhooks' turn.completed.
    # It must not block (it schedules the event's storing), so no receiver can slow a turn; the data
    # is made only for a tenant with a hook that listens.
    on_completed: Callable[[str, Callable[[], dict[str, Any]]], None] | None = None

    def send_query(self, message: Message) -> SendQuery:
        """What sends a turn's query with its start (`SendQuery`): the model proxy admits the turn's
        calls (or holds them, `held`), and the query goes to the bridge, at once; `run` then only
        reads its frames."""

        def send(ticket: TurnTicket, held: bool) -> SentQuery | None:
            if not ticket.connection.start_query(message.content, **self._query_fields(ticket, message)):
                return None
            model_turn = ModelTurn(self.model_proxy, ticket, message.max_budget_usd, held=held)

            def withdraw() -> Coroutine[Any, Any, None]:
                model_turn.end()  # no call is admitted from now on
                return ticket.connection.withdraw(ticket.query_id)  # type: ignore[no-any-return]

            return SentQuery(withdraw, model_turn.admit)

        return send

    @staticmethod
    def _query_fields(ticket: TurnTicket, message: Message) -> dict[str, Any]:
        return {"model": ticket.model, "include_partial_messages": message.include_partial_messages,
                "query_id": ticket.query_id, "maxBudgetUsd": message.max_budget_usd,
                "config": ticket.live_config, **message.options}

    async def run(self, ticket: TurnTicket, message: Message, sink: FrameSink, lookup_ms: float,
                  ended: Callable[[TurnTicket, Session | None], Awaitable[None]] | None = None) -> None:
        """Drive one turn to the end whatever the reader does; stored before `done` is sent, and
        `ended` (the session's turn over: its sandbox waiting again) awaited before it too, with the
        session's row as the turn's last batch left it (None when that batch was not stored)."""
        recorder = TurnRecorder(self.sessions, ticket.session_id, ticket.tenant, self.limits, ticket.first_event)
        first_event_ms: float | None = None
        count = 0
        stopped = False  # past a storage bound: the bridge winds the query down, nothing more is kept

        async def limits_check() -> list[dict[str, Any]]:
            nonlocal count, stopped
            if stopped:
                return []
            try:
                notices = await self._report_limits(ticket, recorder, sink)
            except TurnLimitReached as exc:
                stopped = True
                await self._stop_turn(ticket, recorder, sink, exc)
                return []
            count += sum(1 for n in notices if n.new)
            return [n.to_json() for n in notices]

        # A query sent with the turn's start (`send_query`) has its calls admitted already.
        model_turn = ModelTurn(self.model_proxy, ticket, message.max_budget_usd, begun=ticket.sent)
        try:
            frames = ticket.connection.query(message.content, on_limits_check=limits_check, sent=ticket.sent,
                                             **self._query_fields(ticket, message))
            # Closed here, not when the collector finds it: no finaliser task, and the query's
            # routing entry goes at once.
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    kind = frame.get("type")
                    if first_event_ms is None:
                        first_event_ms = (time.monotonic() - ticket.started) * 1000
                    if kind == "done":
                        break
                    if stopped:
                        continue
                    if kind == "message":
                        data = frame.get("data")
                        if not isinstance(data, dict):
                            continue
                        raw = compact_json.dumps(data)
                        try:
                            seq = await recorder.message(data, raw)
                        except (TurnLimitReached, StorageError) as exc:
                            stopped = True
                            await self._stop_turn(ticket, recorder, sink, exc)
                            continue
                        count += 1
                        await sink.send("message", raw, seq)
                    elif kind == "error":
                        count += 1
                        try:
                            await _send_error(recorder, sink, str(frame.get("error") or "agent error"), counted=True)
                        except TurnLimitReached as exc:
                            stopped = True
                            await self._stop_turn(ticket, recorder, sink, exc)
            # Limits hit outside a tool call (an MCP server, a background process) are told at the end.
            await limits_check()
        except (SandboxError, OSError) as exc:
            reason = await self._sandbox_failure(ticket, exc)
            await _send_error(recorder, sink, reason)
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(ticket, recorder, sink, model_turn, ended))
            raise
        finally:
            model_turn.end()  # the model may no longer be called, also when something above failed
        model = await self._finish(ticket, recorder, sink, model_turn, ended)
        if self.debug_timing:
            emit_line({"type": "timing", "source": "server", "sessionId": ticket.session_id,
                       "sandboxId": ticket.sandbox_id, "lookupMs": round(lookup_ms, 3),
                       "firstEventMs": round(first_event_ms or 0.0, 3),
                       "totalMs": round((time.monotonic() - ticket.started) * 1000, 3), "eventCount": count,
                       "modelMs": round(model.model_ms, 3), "modelCalls": model.calls,
                       "timestamp": iso(utcnow())})

    async def _stop_turn(self, ticket: TurnTicket, recorder: TurnRecorder, sink: FrameSink,
                         exc: Exception) -> None:
        """A storage bound was reached (or storage failed for a whole retry window): say so, stop the
        agent, and let the loop drain what the bridge still sends without keeping it."""
        if isinstance(exc, TurnLimitReached):
            message = exc.message
        else:
            message = (f"This turn was stopped: {exc.message if isinstance(exc, StorageError) else exc}. The "
                       "frames shown after the last stored id are not in the session's history")
        await _send_error(recorder, sink, message)
        with contextlib.suppress(SandboxError):
            await ticket.connection.interrupt(ticket.query_id)

    async def _finish(self, ticket: TurnTicket, recorder: TurnRecorder, sink: FrameSink,
                      model_turn: ModelTurn,
                      ended: Callable[[TurnTicket, Session | None], Awaitable[None]] | None = None,
                      ) -> TurnSummary:
        model, calls = await model_turn.finish()  # the model calls' records are stored with `done`
        # Token usage is not taken from the turn: the sandbox could report anything. The model proxy
        # records what the model API reported for every call (stored just above). The turn's own
        # counts are stored with its last frames, in one transaction.
        compute_seconds = ticket.compute_seconds()
        usage = {"tool_calls": float(recorder.tool_calls), "message": 1.0, "compute_seconds": compute_seconds}
        try:
            done = await recorder.done(TurnUsage(ticket.agent_name, usage), calls)
        finally:
            model_turn.give_back(recorder.unstored_calls())  # a call is paid for: its record is kept
        if done.unstored:
            # The values go to the log so that the operator can still account for the turn.
            log.error("usage of a turn could not be stored", extra={"sessionId": ticket.session_id,
                                                                    "tenant": ticket.tenant, "usage": usage})
            first, last = min(done.unstored), max(done.unstored)
            await sink.send("error", json.dumps({"error": (
                f"The server's data disk is full (or its database unreachable): {len(done.unstored)} frames of "
                f"this turn (ids {first}-{last}) reached you but could not be stored within "
                f"{self.limits.retry_seconds:g} s. They are missing from the session's history and "
                "will not be replayed; nothing stored before was lost. Send the message again once space is "
                "freed")}))
        if ended is not None:
            await ended(ticket, None if done.unstored else recorder.final_row)
        await sink.send("done", done.raw, done.sequence)
        if self.on_completed is not None:
            try:
                self.on_completed(ticket.tenant, lambda: _completed_event(ticket, recorder, model, compute_seconds,
                                                                          bool(done.unstored)))
            except Exception:
                log.exception("turn.completed event failed", extra={"sessionId": ticket.session_id})
        return model

    async def _report_limits(self, ticket: TurnTicket, recorder: TurnRecorder,
                             sink: FrameSink) -> list[LimitNotice]:
        """The limits the sandbox hit, read on the host (cgroup counters, the disk's fill), never taken
        from the bridge: each new one becomes an `error` frame and event, counted against the turn's
        bounds (a sandbox can hit its limits on purpose, as often as it likes). The bridge's
        `limits_check` gets them all, for the tool result the model reads."""
        # On the loop: a few reads of kernel counters and one statvfs, no disk I/O; a trip to a thread
        # and back cost more than the reads (docs/performance.md, sixteenth pass).
        notices: list[LimitNotice] = ticket.meter.check() if ticket.meter is not None else []
        for notice in (n for n in notices if n.new):
            log.warning("sandbox limit hit: %s", notice.message, extra={
                "sessionId": ticket.session_id, "sandboxId": ticket.sandbox_id, "limit": notice.limit})
            self.metrics.count_limit_hit(notice.limit)
            await _send_error(recorder, sink, notice.message, counted=True, limit=notice.limit)
        return notices

    async def _sandbox_failure(self, ticket: TurnTicket, exc: Exception) -> str:
        info = None
        for _ in range(20):  # the process may need a moment to be reaped after the socket closed
            info = await self.exit_info(ticket.sandbox_id)
            if info is not None:
                return f"sandbox crashed: {info.describe()}"
            await asyncio.sleep(0.05)
        return f"sandbox connection lost: {exc}"


async def _send_error(recorder: TurnRecorder, sink: FrameSink, message: str, *, counted: bool = False,
                      limit: str | None = None) -> None:
    """An `error` frame, stored with its id; without an id when storage is failing (it is not stored)."""
    try:
        seq, raw = await recorder.error(message, counted=counted, limit=limit)
    except StorageError:
        data = {"error": message} if limit is None else {"error": message, "limit": limit}
        await sink.send("error", json.dumps(data))
        return
    await sink.send("error", raw, seq)


RESULT_SUMMARY_CHARS = 2000


def _completed_event(ticket: TurnTicket, recorder: TurnRecorder, model: TurnSummary, compute_seconds: float,
                     unstored: bool) -> dict[str, Any]:
    """The `turn.completed` webhook's data: what ended the turn and what it used."""
    result = recorder.result or {}
    text = result.get("result")
    return {
        "sessionId": ticket.session_id,
        "agentName": ticket.agent_name,
        "stopReason": result.get("stop_reason") or result.get("subtype") or ("error" if not result else None),
        "subtype": result.get("subtype"),
        "isError": bool(result.get("is_error")) or not result or unstored,
        "result": text[:RESULT_SUMMARY_CHARS] if isinstance(text, str) else None,
        "numTurns": result.get("num_turns"),
        "usage": result.get("usage") if isinstance(result.get("usage"), dict) else None,
        "model": {"calls": model.calls, "costUsd": round(model.cost_usd, 6)},
        "toolCalls": recorder.tool_calls,
        "computeSeconds": compute_seconds,
        "durationMs": round((time.monotonic() - ticket.started) * 1000),
    }
