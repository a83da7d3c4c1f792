"""Warm-up of a session's first turn: once in the fork server (zygote), and again in each bridge.

The first model call of a process builds what the engine and the model client build on first use
(the engine's tools and prompts, the client's connection and the stream's decoding). In a fresh
process that is many ms of a session's first message, and each sandbox's bridge built its own copy
(private memory). Run once in the zygote before it forks, the work is
inherited by every sandbox's bridge and shared copy-on-write. One streamed request through the
model client and one turn of the built-in engine, both answered by a unix socket of this process
(so the client's whole path is warm, its transport's connect included): no network, no model.

A bridge forked from the zygote shares those pages until it writes them, and a turn writes many
(reference counts, caches): about 7 MiB of copy-on-write faults, several ms of a session's first
message here. So a bridge that has waited `IDLE_S` without being given a session (a spare in the
pool) runs the same warm-up again, in the background: the copies are made while it is idle, not
during the first message. A bridge given its session at once (a create with no spare left) skips
it: its warm-up would only compete with the session's own start on the same cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ashd.bridge.engine._model import call_model, make_client

_EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {"id": "msg_warm", "type": "message", "role": "assistant", "model": "warm",
                                          "content": [], "stop_reason": None, "stop_sequence": None,
                                          "usage": {"input_tokens": 1, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "."}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2,
     "content_block": {"type": "tool_use", "id": "toolu_warm", "name": "warm", "input": {}}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]
_BODY = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in _EVENTS).encode()


# A plain answer for the engine's turn (a tool use would make it run a tool).
_TEXT_EVENTS: list[dict[str, Any]] = [
    _EVENTS[0],
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 1}},
    _EVENTS[-1],
]
_TEXT_BODY = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in _TEXT_EVENTS).encode()


@contextlib.asynccontextmanager
async def _model_socket(body: bytes) -> AsyncIterator[str]:
    """A unix socket in this process that answers every request with `body` as an event stream: the
    warm-up's requests take the real client's whole path (connect, HTTP/1.1, chunks, events), as a
    turn's do through the model proxy's socket."""

    handlers: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers[task] = writer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if task is not None:
                handlers.pop(task, None)
            writer.close()

    with tempfile.TemporaryDirectory(prefix="ashd-warm-") as folder:
        path = str(Path(folder) / "model.sock")
        server = await asyncio.start_unix_server(answer, path)
        try:
            yield path
        finally:
            server.close()
            # A connection the client kept open would leave its handler waiting for a request that
            # never comes: a task and a socket kept for the bridge's life, or, in the fork server,
            # cancelled by `asyncio.run`'s end with a traceback in its log. Closed, it reads the end.
            for writer in handlers.values():
                writer.close()
            if handlers:
                await asyncio.wait(list(handlers), timeout=1)
            await server.wait_closed()


async def _quiet(*_args: Any) -> None:
    return None


async def _one_turn() -> None:
    from ashd.bridge.engine import Engine, EngineConfig, QueryOptions

    async with _model_socket(_TEXT_BODY) as socket:
        with tempfile.TemporaryDirectory(prefix="ashd-warm-") as workspace:
            config = EngineConfig.from_init({"systemPrompt": "warm"}, Path(workspace), None)
            engine = Engine(config, _quiet, client=make_client(socket))
            await engine.start()
            try:
                await engine.query("warm", emit=_quiet, options=QueryOptions())
            finally:
                await engine.close()


async def _one_request() -> None:
    async with _model_socket(_BODY) as socket:
        client = make_client(socket)
        try:
            await call_model(client, {
                "model": "warm-up", "max_tokens": 16,
                "system": [{"type": "text", "text": "warm", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "warm"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "warm", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}],
                "tools": [{"name": "warm", "description": "warm",
                           "input_schema": {"type": "object", "properties": {}}}],
            }, betas=["warm-up"], on_event=_quiet, max_retries=0)
        finally:
            await client.close()


async def _both() -> None:
    await _one_request()
    await _one_turn()


def warm() -> None:
    """One streamed request through the model client and one engine turn, answered by a unix
    socket of this process; raises what it meets."""
    asyncio.run(_both())


# Soon after the bridge's first connection: a spare is often claimed within a second of its start
# (sessions created in a row), and a first message in a bridge not warmed again took 8.5 ms to its
# first frame against 5.5 (scripts/bench_sessions.py; docs/performance.md, sixth pass). A spare's
# first connection is the server's warmer's, made as the spare joins the pool, and no `init`
# follows it; a bridge started for a session that waits for it (no spare was left) gets the
# session's `init` right behind its first connection, and skips the warm-up. Counted from the
# connection, not the process's start: how long a start takes depends on the host's load.
IDLE_S = 0.02


async def warm_when_idle(idle: Callable[[], bool], connected: asyncio.Event | None = None,
                         after_s: float = IDLE_S) -> None:
    """The bridge's own warm-up (see above), once it has been `idle()` for `after_s` seconds after
    its first connection (`connected`), each of its two parts only while still idle; a failure only
    costs the first turn its speed."""
    log = logging.getLogger(__name__)
    if connected is not None:
        await connected.wait()
    await asyncio.sleep(after_s)
    if not idle():
        log.debug("bridge warm-up skipped: the session came first")
        return
    started = time.monotonic()
    try:
        await _one_request()
        if not idle():
            log.debug("bridge warm-up cut short: the session came")
            return
        await _one_turn()
    except Exception:  # nothing depends on it
        log.warning("bridge warm-up failed; the first turn will be slower", exc_info=True)
        return
    log.debug("bridge warm-up done in %.1f ms", (time.monotonic() - started) * 1000)
