"""Bridge protocol v2 (v1 still spoken): newline-delimited JSON frames over a Unix stream socket.

Shared by the bridge (inside the sandbox) and the server's bridge client. The authoritative
description is `docs/protocol.md`. Both readers ignore unknown fields; frames are capped at
`MAX_FRAME_BYTES` (the terminating newline included).

The reader works on a raw non-blocking socket and only calls `recv` when its caller asks for the
next frame, so a consumer that stops asking stops reading the kernel buffer: that is what carries
backpressure from a slow SSE client back to the agent engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

from ashd import compact_json

PROTOCOL_VERSION = 2
# 2 adds the bridge's `limits_check` request and the server's `limits_report` answer.
SUPPORTED_VERSIONS = (1, 2)
MAX_FRAME_BYTES = 16 * 1024 * 1024
_RECV_CHUNK = 64 * 1024

# server -> bridge
HELLO = "hello"
INIT = "init"
QUERY = "query"
INTERRUPT = "interrupt"
EXEC = "exec"
SHUTDOWN = "shutdown"
PING = "ping"
LIMITS_REPORT = "limits_report"  # v2: the answer to a bridge's limits_check
# A query sent before its prompt was stored, whose storing failed: ended, and left out of the
# conversation. Sent only to a bridge whose `init_ok` says `withdraw: true`.
WITHDRAW = "withdraw"
COMMAND_TYPES = frozenset({HELLO, INIT, QUERY, INTERRUPT, EXEC, SHUTDOWN, PING, LIMITS_REPORT, WITHDRAW})

# bridge -> server
READY = "ready"
INIT_OK = "init_ok"
MESSAGE = "message"
ERROR = "error"
DONE = "done"
LOG = "log"
EXEC_RESULT = "exec_result"
PONG = "pong"
LIMITS_CHECK = "limits_check"  # v2: after a tool call, "did the sandbox hit a limit?"
EVENT_TYPES = frozenset({READY, INIT_OK, MESSAGE, ERROR, DONE, LOG, EXEC_RESULT, PONG, LIMITS_CHECK})

Frame = dict[str, Any]


class ProtocolError(Exception):
    """A frame could not be encoded or decoded."""


class FrameTooLarge(ProtocolError):
    """A frame exceeds MAX_FRAME_BYTES; on read, the oversized line has been discarded."""


def encode(frame: Frame) -> bytes:
    """One frame as bytes, newline included. Raises FrameTooLarge or ProtocolError."""
    if not isinstance(frame.get("type"), str):
        raise ProtocolError("a frame needs a string 'type'")
    try:
        data = compact_json.dumps(frame).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"frame is not JSON-serialisable: {exc}") from exc
    if len(data) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES} byte cap")
    return data


def decode(line: bytes | str) -> Frame:
    """One line (with or without its newline) to a frame dict. Raises ProtocolError."""
    if len(line) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(line)} bytes exceeds the {MAX_FRAME_BYTES} byte cap")
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProtocolError("a frame must be a JSON object with a string 'type'")
    return value


def make(type_: str, **fields: Any) -> Frame:
    """Build a frame, leaving out fields whose value is None."""
    frame: Frame = {"type": type_}
    frame.update({k: v for k, v in fields.items() if v is not None})
    return frame


class FrameReader:
    """Reads frames from a connected non-blocking stream socket, one `recv` at a time."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME_BYTES) -> None:
        sock.setblocking(False)  # `_recv_now` reads it on the loop's thread
        self._sock = sock
        self._buf = bytearray()
        self._max = max_frame
        self._discarding = False
        self._recv: asyncio.Future[bytes] | None = None
        self.eof = False

    def abort(self) -> None:
        """Cancel a pending recv. Call before closing the socket: a recv left registered on a
        closed fd would steal the events of the next socket that reuses the fd number."""
        if self._recv is not None and not self._recv.done():
            self._recv.cancel()
        self._recv = None

    async def read(self) -> Frame | None:
        """The next frame, or None at EOF. Raises FrameTooLarge (line skipped) or ProtocolError."""
        loop = asyncio.get_running_loop()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                if self._discarding:
                    self._discarding = False
                    raise FrameTooLarge(f"frame exceeds the {self._max} byte cap; it was discarded")
                if len(line) > self._max:
                    raise FrameTooLarge(f"frame of {len(line)} bytes exceeds the {self._max} byte cap")
                if line.strip():
                    return decode(line)
                continue
            if len(self._buf) > self._max:
                # Keep memory bounded: drop what we have and skip to the end of this line.
                self._discarding = True
                self._buf.clear()
            if self.eof:
                return None
            chunk = self._recv_now() if self._recv is None else None
            if chunk is None:
                # The recv outlives a cancelled caller (shield): bytes it took off the socket are
                # picked up by the next read instead of being lost with the cancelled one.
                if self._recv is None:
                    self._recv = asyncio.ensure_future(loop.sock_recv(self._sock, _RECV_CHUNK))
                chunk = await asyncio.shield(self._recv)
                self._recv = None
            if not chunk:
                self.eof = True
                if self._buf.strip() and not self._discarding:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return decode(line)
                return None
            self._buf += chunk

    def _recv_now(self) -> bytes | None:
        """What the socket holds now, without the loop (None: nothing yet). The frames of a burst
        (a turn's stream) are mostly there when the previous one is handled: read here, they take
        no task and no loop iteration each."""
        try:
            return self._sock.recv(_RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return None


class FrameWriter:
    """Writes whole frames; each `write` returns once the frame sits in the kernel send buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = asyncio.Lock()
        self._send: asyncio.Future[None] | None = None
        self._writers = 0  # `write` calls in progress, waiting for the lock or holding it
        # The rest of a frame `send_now` could not send whole: it goes before any other frame.
        self._rest: asyncio.Future[None] | None = None

    def send_now(self, frame: Frame) -> bool:
        """Put `frame` on the wire before returning, without the loop: where no other write is in
        progress (False, and nothing sent, otherwise). A frame the socket does not take whole has
        its rest sent first thing, before any later frame."""
        if self._writers or self._rest is not None:
            return False
        data = encode(frame)
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            rest = self._rest = asyncio.ensure_future(self._send_rest(memoryview(data)[sent:]))
            # Its failure is the connection's, which the next write or read reports.
            rest.add_done_callback(lambda f: f.cancelled() or f.exception())
        return True

    async def _send_rest(self, rest: memoryview) -> None:
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, rest)
        finally:
            self._rest = None

    def abort(self) -> None:
        """Cancel a pending send (see FrameReader.abort); call before closing the socket."""
        for send in (self._send, self._rest):
            if send is not None and not send.done():
                send.cancel()

    async def write(self, frame: Frame) -> None:
        data = encode(frame)
        self._writers += 1
        try:
            if self._rest is not None:  # (shielded: a cancelled writer must not cut another's frame)
                await asyncio.shield(self._rest)
            await self._write(data)
        finally:
            self._writers -= 1

    async def _write(self, data: bytes) -> None:
        async with self._lock:
            # Most frames fit the socket's free buffer: sent here and now, without a task and the
            # loop iterations it takes to start and finish (a turn's query, each frame of a turn).
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(data):
                return
            rest = memoryview(data)[sent:]
            send = self._send = asyncio.ensure_future(asyncio.get_running_loop().sock_sendall(self._sock, rest))
            try:
                await asyncio.shield(send)
            except asyncio.CancelledError:
                # Never leave half a frame on the wire: finish this frame, then honour the cancel.
                if not send.done():
                    await asyncio.wait([send])
                raise


def close_socket(sock: socket.socket, reader: FrameReader | None, writer: FrameWriter | None) -> None:
    """Close a socket used by a reader/writer pair, after cancelling their pending I/O.

    On a running loop the socket is closed one callback later: a cancelled `sock_recv` removes
    its reader from the socket's fd in a callback of its own, and had the fd been closed and taken
    by a new transport before it ran (the bridge's model connection, right after a reconnect), it
    would remove that transport's reader instead (Python 3.13 raises there; seen in CI as a query
    that never ended)."""
    if reader is not None:
        reader.abort()
    if writer is not None:
        writer.abort()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        sock.close()
        return
    loop.call_soon(sock.close)  # after the cancelled operations' own callbacks, queued before it


def shrink_buffers(sock: socket.socket, size: int = 32 * 1024) -> None:
    """Small kernel buffers so that backpressure shows within a few frames, not megabytes."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
