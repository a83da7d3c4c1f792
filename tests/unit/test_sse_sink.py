"""SseSink over real HTTP on loopback, with raw-socket clients that stop reading or go away.

What a stream's producer can rely on (the turn driver keeps draining the turn whatever the client
does): how far it runs ahead of a client that stopped reading (a number: one frame plus the
kernel's buffers, not megabytes), that a client stalled past the read timeout is cut off and its
connection freed, and that `send` answers False for good once the client is gone.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import termios
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp_sse import EventSourceResponse

from ashd.http import _sse
from ashd.http._sse import SseSink

FRAME = "x" * 1000  # about 1 KiB per frame on the wire
FRAMES = 4000  # 4 MB: far more than any buffer between the two ends
FRAME_ON_WIRE = len(FRAME) + 64  # with its SSE fields and chunked framing
# Kernel send buffer (16 KiB asked, 32 KiB given) + the client's receive buffer (4 KiB asked) +
# one frame in the transport. Measured on loopback: 27 KB ahead; without the drain after each
# frame 62 KB, without the transport's write-buffer limit 90 KB, without the small send buffer
# 2.7 MB.
BOUND = 48 * 1024
# README, operations: the kernel send buffer a stalled client holds in the server (16 KiB asked
# per stream; Linux reports and allows twice what is asked, for its bookkeeping).
SERVER_SNDBUF = 32 * 1024


@dataclass
class Producer:
    read_timeout: float | None = None
    sent: int = 0  # frames the kernel has taken
    sending: bool = False
    results: list[bool] = field(default_factory=list)
    reason: str | None = None
    transport: Any = None
    _task: Any = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        sink = await SseSink.open(request, read_timeout=self.read_timeout)
        self.transport = request.transport
        # As the turn driver does: the producer is its own task, so a handler cancelled by a
        # lost connection does not stop it.
        task = asyncio.get_running_loop().create_task(self._produce(sink))
        self._task = task
        await asyncio.shield(task)
        return sink.response

    async def _produce(self, sink: SseSink) -> None:
        try:
            for n in range(FRAMES):
                self.sending = True
                ok = await sink.send("message", FRAME, n)
                self.sending = False
                self.results.append(ok)
                if not ok:
                    # The turn goes on without the client: later frames are refused at once.
                    self.results.append(await sink.send("message", FRAME, n + 1))
                    break
                self.sent += 1
            self.reason = sink.reason
            await sink.close()
        except BaseException as exc:
            self.reason = repr(exc)
            raise
        finally:
            self.finished.set()

    def stalled(self) -> bool:
        """The producer waits in `send` because the connection stopped taking bytes (aiohttp pauses
        writing when the transport's buffer passes its limit; only a reading client resumes it)."""
        t = self.transport
        return (self.sending and t is not None and not t.is_closing()
                and bool(t.get_protocol().writing_paused))


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[TestServer] = []

    async def start(producer: Producer) -> tuple[str, int]:
        app = web.Application()
        app.router.add_post("/stream", producer.handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return str(server.host), int(server.port or 0)

    yield start
    for server in servers:
        await server.close()


async def _client(host: str, port: int) -> socket.socket:
    """A client with a small receive buffer that has sent its request and reads nothing yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    await loop.sock_sendall(sock, b"POST /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    return sock


async def _held(producer: Producer, polls: int = 5, timeout: float = 30.0) -> None:
    """Until the producer is blocked: stalled, with no progress over several polls. The producer
    shares this event loop, so while the poll waits, a producer that is not blocked runs."""
    async with asyncio.timeout(timeout):
        still, last = 0, -1
        while still < polls:
            await asyncio.sleep(0.005)
            if producer.stalled() and producer.sent == last:
                still += 1
            else:
                still, last = 0, producer.sent


async def _until(condition: Any, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def _read_all(sock: socket.socket, timeout: float = 60.0) -> bytes:
    loop, out = asyncio.get_running_loop(), bytearray()
    async with asyncio.timeout(timeout):
        while True:
            try:
                chunk = await loop.sock_recv(sock, 65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    return bytes(out)


async def test_a_stalled_reader_holds_the_producer_within_the_bound(serve: Any) -> None:
    producer = Producer()
    sock = await _client(*await serve(producer))
    try:
        await _held(producer)
        ahead = producer.sent * len(FRAME)
        assert 0 < ahead <= BOUND, f"the producer ran {ahead} bytes ahead of a client that reads nothing"
        queued = producer.transport.get_write_buffer_size()  # in the server process, not the kernel
        assert queued <= FRAME_ON_WIRE, f"{queued} bytes queued in the transport: more than the frame in flight"
        # What the server's kernel holds for this client: its send buffer is the documented size
        # and the bytes waiting in it stay within it.
        server_socket = producer.transport.get_extra_info("socket")
        assert server_socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == SERVER_SNDBUF
        unsent = int.from_bytes(fcntl.ioctl(server_socket.fileno(), termios.TIOCOUTQ, bytes(4)), "little")
        assert 0 < unsent <= SERVER_SNDBUF, f"{unsent} bytes held in the server's kernel for a stalled client"
        body = await _read_all(sock)  # the client reads again: every frame arrives, in order
    finally:
        sock.close()
    await _until(producer.finished.is_set)
    assert producer.sent == FRAMES and producer.reason is None
    assert body.count(b"event: message") == FRAMES
    ids = [int(line[4:]) for line in body.split(b"\n") if line.startswith(b"id: ")]
    assert ids == list(range(FRAMES))  # each frame carries its id, for Last-Event-ID replay


async def _response(sock: socket.socket, timeout: float = 30.0) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response's head and body from a keep-alive connection (a Content-Length body or
    a chunked one), reading no further."""
    loop, buf = asyncio.get_running_loop(), bytearray()
    async with asyncio.timeout(timeout):
        while b"\r\n\r\n" not in buf:
            buf += await loop.sock_recv(sock, 65536)
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        body = bytearray(rest)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None)
        while not (len(body) >= length if length is not None else body.endswith(b"0\r\n\r\n")):
            body += await loop.sock_recv(sock, 65536)
    return head, bytes(body)


async def test_a_connection_kept_alive_after_its_stream_gets_its_buffers_back() -> None:
    # An SDK (or nginx, to its upstream) sends its next request on the connection a stream used.
    # That request's answer must not crawl through a stream's 32 KiB send buffer.
    transports: list[Any] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        sink = await SseSink.open(request)
        transports.append(request.transport)
        for n in range(3):
            assert await sink.send("message", FRAME, n)
        server_socket = request.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert server_socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == SERVER_SNDBUF
        await sink.close()
        return sink.response

    big = b"y" * (2 * 1024 * 1024)

    async def large(_request: web.Request) -> web.Response:
        return web.Response(body=big)

    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_get("/big", large)
    server = TestServer(app)
    await server.start_server()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, (server.host, server.port))
        await loop.sock_sendall(sock, b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        head, body = await _response(sock)
        assert head.startswith(b"HTTP/1.1 200") and body.count(b"event: message") == 3
        [transport] = transports
        server_socket = transport.get_extra_info("socket")
        wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
        given = server_socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert given == 2 * min(_sse._SNDBUF_AFTER, wmem_max) and given > 4 * SERVER_SNDBUF
        assert transport.get_write_buffer_limits()[1] > 0  # no longer a limit of zero
        # The next request on the same connection gets its whole answer.
        await loop.sock_sendall(sock, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await _response(sock)
        assert head.startswith(b"HTTP/1.1 200") and body == big
        assert transports == [transport] and not transport.is_closing()  # it was the same connection
    finally:
        sock.close()
        await server.close()


async def test_a_reader_stalled_past_the_timeout_is_cut_off(serve: Any) -> None:
    producer = Producer(read_timeout=1.0)
    sock = await _client(*await serve(producer))
    try:
        await _held(producer)
        in_flight = producer.sent  # the frame the kernel would not take
        await _until(producer.finished.is_set)
        assert producer.reason == "client read timeout"
        assert producer.results == [True] * in_flight + [False, False]  # that frame is not sent
        assert producer.sent == in_flight
        # The server's end is closed at once (aborted), not left waiting for a reader that
        # may never come back with its buffers full.
        server_socket = producer.transport.get_extra_info("socket")
        await _until(lambda: server_socket.fileno() == -1)
        # Reading again, the client gets what the kernels held (frames in order, the last one
        # perhaps cut) and then the end of the connection, never a frame sent after the cut.
        got = await _read_all(sock)
        ids = [int(line[4:]) for line in got.split(b"\n") if line.startswith(b"id: ")]
        assert ids and ids == list(range(len(ids))) and len(ids) <= in_flight + 1
    finally:
        sock.close()


async def test_a_client_gone_is_dead_for_good(serve: Any) -> None:
    producer = Producer()
    sock = await _client(*await serve(producer))
    await _until(lambda: producer.sent > 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # RST: the client is gone
    await _until(producer.finished.is_set)
    assert producer.reason == "client disconnected"
    assert producer.results[-2:] == [False, False]
    assert producer.sent < FRAMES


def test_the_default_read_timeout_is_the_interfaces_30_seconds() -> None:
    from aiohttp_sse import EventSourceResponse

    # interface.md, timeouts: "Idle client on SSE stream: 30 seconds".
    assert SseSink(EventSourceResponse()).read_timeout == 30.0
    assert SseSink(EventSourceResponse(), read_timeout=0.5).read_timeout == 0.5


async def test_a_quiet_stream_is_kept_open_with_pings(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comment proxies see on a stream with nothing to say (README: every 15 s; shortened here)."""
    monkeypatch.setattr(_sse, "PING_INTERVAL", 0.05)
    done = asyncio.Event()

    async def quiet(request: web.Request) -> web.StreamResponse:
        sink = await SseSink.open(request)
        await done.wait()
        await sink.close()
        return sink.response

    app = web.Application()
    app.router.add_post("/stream", quiet)
    server = TestServer(app)
    await server.start_server()
    sock = await _client(str(server.host), int(server.port or 0))
    try:
        loop, seen = asyncio.get_running_loop(), bytearray()
        async with asyncio.timeout(30):
            while seen.count(b": ping\n\n") < 3:
                seen += await loop.sock_recv(sock, 4096)
        done.set()
        body = seen + await _read_all(sock)
    finally:
        sock.close()
        await server.close()
    head, _, stream = bytes(body).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Type: text/event-stream" in head
    assert b"event:" not in stream and stream.endswith(b"0\r\n\r\n")  # pings only, then the end


def test_the_default_ping_interval_is_the_readmes_15_seconds() -> None:
    # README, operations: "Streams send a `: ping` comment every 15 s" (proxies time out idle
    # streams: nginx's default proxy_read_timeout is 60 s). Seeing the default on the wire would
    # take a 15 s wait and a clock bound; the test above shows this setting is what paces them.
    assert _sse.PING_INTERVAL == 15.0


@pytest.mark.parametrize(("event", "data", "event_id"), [
    ("message", '{"type":"assistant","text":"h\\u00e9 \\n"}', 7),
    ("done", "{}", None),
    ("error", "", 3),
    ("message", "two\nlines\r\nthree\rfour", 12),
    ("message", "é ✓ \u2028", 1),
])
async def test_a_frame_is_written_as_aiohttp_sse_writes_it(event: str, data: str, event_id: int | None) -> None:
    """`send` writes its frames itself (no task or timer for a frame the kernel takes at once):
    byte for byte what aiohttp-sse's own `send` writes with the same line ends."""
    written: list[bytes] = []
    response = EventSourceResponse(sep="\n")

    async def capture(chunk: bytes | bytearray | memoryview) -> None:
        written.append(bytes(chunk))

    response.write = capture  # type: ignore[method-assign,assignment]
    await response.send(data, id=None if event_id is None else str(event_id), event=event)
    assert _sse.sse_frame(event, data, event_id) == b"".join(written)


def test_an_event_name_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError):
        _sse.sse_frame("message\ndata: forged", "{}")
