"""SSE with real backpressure: one frame in flight, a stalled client detected after 30 s.

The socket's send buffer is shrunk and the transport's write buffer limit set to zero, so after
each frame `drain()` waits until the kernel took it (notes/measured.md Q2). A client that goes
away or stops reading only ends its own connection: the caller keeps draining the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from pathlib import Path
from typing import cast

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp_sse import EventSourceResponse

log = logging.getLogger(__name__)
CLIENT_READ_TIMEOUT = 30.0  # a client that takes no bytes for this long is cut off
PING_INTERVAL = 15.0  # a `: ping` comment on a quiet stream, so proxies keep it open
_SNDBUF = 16 * 1024  # asked per stream; Linux doubles it: 32 KiB a stalled client holds, plus a frame


def _autotuned_max() -> int:
    """The most the kernel's autotuning gives a TCP socket's send buffer (`tcp_wmem`'s third value)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 1024 * 1024  # Linux's default


# What a connection's send buffer is given back when its stream ends. The stream's setting locked
# the buffer's size (the kernel no longer tunes it), so it gets the most tuning would have given it,
# as far as the host's `net.core.wmem_max` lets an unprivileged setting go.
_SNDBUF_AFTER = _autotuned_max() // 2  # asked: Linux doubles it


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def sse_frame(event: str, data: str, event_id: int | None = None) -> bytes:
    """One frame as aiohttp-sse writes it with LF line ends: `id:`, `event:`, a `data:` line for
    each line of `data` (JSON text has none), and the blank line that ends it."""
    if "\n" in event or "\r" in event:
        raise ValueError("an event name must not contain line breaks")
    head = f"event: {event}\n" if event_id is None else f"id: {event_id}\nevent: {event}\n"
    if "\n" in data or "\r" in data:
        return (head + "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data)) + "\n").encode()
    return f"{head}data: {data}\n\n".encode()


class SseSink:
    def __init__(self, response: EventSourceResponse, read_timeout: float | None = None) -> None:
        self.response = response
        # Read at call time, not at import: tests shorten the module constant.
        self.read_timeout = CLIENT_READ_TIMEOUT if read_timeout is None else read_timeout
        self.alive = True
        self.reason: str | None = None

    @classmethod
    async def open(cls, request: web.Request, read_timeout: float | None = None) -> SseSink:
        # LF line ends (aiohttp-sse defaults to CRLF): both are legal SSE, but clients written for
        # the reference implementation split lines on "\n" alone and would see "message\r".
        response = EventSourceResponse(send_timeout=None, ping_interval=PING_INTERVAL, allow_all_methods=True,
                                       sep="\n")
        response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        transport = request.transport
        if transport is not None:
            _tcp_send_buffer(transport, _SNDBUF)
            transport.set_write_buffer_limits(high=0)
        return cls(response, read_timeout)

    async def send(self, event: str, data: str, event_id: int | None = None) -> bool:
        """Send one frame and wait until the kernel has it. False once the client is gone.

        The frame is written without waiting; as a rule the kernel takes it at once and that is
        all (no task, no timer: 14 µs a frame less on this machine kind, docs/performance.md,
        twenty-ninth pass). Only what the kernel left in the transport is waited for, in a task
        of its own whose timeout is `asyncio.wait`'s: a timeout that cancelled the caller could
        race with the transport failing and leave a stray cancellation behind, which would cancel
        the turn the caller keeps draining.
        """
        if not self.alive:
            return False
        # The response's own writer: its `write(drain=False)` never waits (StreamResponse.write may).
        writer = cast(StreamWriter, self.response._payload_writer)
        assert writer is not None, "send before open"
        try:
            await writer.write(sse_frame(event, data, event_id), drain=False)
        except (ConnectionError, RuntimeError, OSError):
            self._drop("client disconnected")
            return False
        transport = self.response._req.transport if self.response._req else None
        if transport is None or transport.get_write_buffer_size() == 0:
            return self.alive
        drained = asyncio.ensure_future(writer.drain())
        try:
            done, _ = await asyncio.wait({drained}, timeout=self.read_timeout)
        finally:
            drained.cancel()  # nothing once it is done
        if not done:
            self._cut_off()
            self._drop("client read timeout")
            with contextlib.suppress(BaseException):
                await drained
            return False
        exc = drained.exception()
        if isinstance(exc, ConnectionError | RuntimeError | OSError):
            self._drop("client disconnected")
        elif exc is not None:
            raise exc
        return self.alive

    def _cut_off(self) -> None:
        """A client stalled past the read timeout: its buffers are full, so a graceful close would
        wait for it forever; the abort frees the connection at once. (No error frame: it would
        queue behind the frame the client is not taking, and the abort discards that queue.)"""
        transport = self.response._req.transport if self.response._req else None
        if transport is not None:
            transport.abort()

    def _drop(self, reason: str) -> None:
        self.alive = False
        self.reason = reason
        log.warning("stream client dropped: %s", reason)
        self.response.stop_streaming()

    async def close(self) -> None:
        """The stream ends: aiohttp writes its end (the last chunk) when the handler returns the
        response, which every caller does right after (for a client already gone that write fails
        and aiohttp drops the connection).

        The connection may outlive its stream (HTTP keep-alive: an SDK's next request, nginx's
        connection to its upstream), so its buffers are given back: left at a stream's size, the
        next large answer on it crawled (a 271 KB session list on loopback 1 ms -> 176 ms, the
        kernel waiting on a 32 KiB buffer; docs/performance.md, thirty-seventh pass)."""
        self.response.stop_streaming()
        transport = self.response._req.transport if self.response._req else None
        if self.alive and transport is not None and not transport.is_closing():
            _tcp_send_buffer(transport, _SNDBUF_AFTER)
            transport.set_write_buffer_limits()  # the event loop's defaults


def _tcp_send_buffer(transport: asyncio.BaseTransport, size: int) -> None:
    sock = transport.get_extra_info("socket")
    if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
