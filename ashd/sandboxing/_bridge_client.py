"""The server's side of the bridge protocol (docs/protocol.md).

Frames are read one at a time, only when a caller asks for one: there is no background reader
buffering a whole turn, so a slow SSE client slows the socket, which pauses the bridge's writes,
which pauses the agent engine. Replies for other commands that arrive while a query is being
read (an `exec` during a turn) are parked until their caller picks them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ashd.bridge import protocol as p
from ashd.errors import SandboxError

log = logging.getLogger(__name__)

LogHandler = Callable[[p.Frame], None]
# Answers a query's `limits_check` (protocol v2): the limits the sandbox hit, as {limit, message}.
LimitsHandler = Callable[[], Awaitable[list[dict[str, Any]]]]


def ready_poll_delay(waited: float) -> float:
    """The pause before looking again for a starting bridge's socket, `waited` seconds in.

    A bridge listens 8-20 ms after its launch (more on a loaded host). Looking every millisecond
    for the first 0.2 s costs a failed connect (a few µs) per look and finds it at most 1 ms late;
    the doubling back-off this replaced found it up to 15 ms late (a cold create's p50 went from
    50 to 38 ms). A bridge that is slower than that is slow for a reason: back off then.
    For the loop's own connect only, where a request waits: a thread looking this often would take
    the GIL from the loop a thousand times a second (the pool's spare probe keeps its back-off).
    """
    return 0.001 if waited < 0.2 else 0.02


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _default_log(frame: p.Frame) -> None:
    level = str(frame.get("level") or "info").lower()
    log.log(getattr(logging, level.upper(), logging.INFO), "bridge: %s", frame.get("message"))


async def wait_ready(socket_path: str, timeout: float) -> socket.socket:
    """Connect, retrying while the bridge is still starting (no socket yet, or refused)."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    deadline = start + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        p.shrink_buffers(sock)
        try:
            await loop.sock_connect(sock, socket_path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise SandboxError(
                    f"bridge did not start listening on {socket_path} within {timeout:.0f}s ({exc})"
                ) from exc
            await asyncio.sleep(ready_poll_delay(time.monotonic() - start))
        except BaseException:
            sock.close()
            raise


def _query_frame(prompt: str | list[dict[str, Any]], query_id: str, model: str | None,
                 include_partial_messages: bool, extra: dict[str, Any]) -> p.Frame:
    return p.make(p.QUERY, id=query_id, prompt=prompt, model=model,
                  includePartialMessages=include_partial_messages or None, **extra)


class BridgeConnection:
    def __init__(self, sock: socket.socket, on_log: LogHandler | None = None) -> None:
        self._sock = sock
        self._reader = p.FrameReader(sock)
        self._writer = p.FrameWriter(sock)
        self._read_lock = asyncio.Lock()
        self._parked: dict[str, deque[p.Frame]] = {}
        self._on_log = on_log or _default_log
        self.ready: p.Frame = {}
        self.closed = False
        # The engine can leave a query out of its conversation (`withdraw`), as its `init_ok` says:
        # a turn's query may then go before its prompt is stored (`start_query`).
        self.withdraws = False

    @classmethod
    async def connect(
        cls, socket_path: str, timeout: float = 30.0, on_log: LogHandler | None = None
    ) -> BridgeConnection:
        """Connect (waiting for the bridge to start) and do the hello/ready handshake."""
        sock = await wait_ready(socket_path, timeout)
        conn = cls(sock, on_log)
        try:
            await conn._send(p.make(p.HELLO, protocol=p.PROTOCOL_VERSION, protocols=list(p.SUPPORTED_VERSIONS)))
            async with asyncio.timeout(timeout):
                frame = await conn._next_frame()
            if frame.get("type") != p.READY:
                raise SandboxError(f"bridge refused the handshake: {frame.get('error') or frame}")
            conn.ready = frame
        except BaseException:
            await conn.close()
            raise
        return conn

    def set_log_handler(self, on_log: LogHandler | None) -> None:
        """Where the bridge's `log` frames go from now on (a session's setup output, say)."""
        self._on_log = on_log or _default_log

    @property
    def pid(self) -> int | None:
        value = self.ready.get("pid")
        return value if isinstance(value, int) else None

    # -- low level ---------------------------------------------------------------------------
    async def _send(self, frame: p.Frame) -> None:
        if self.closed:
            raise SandboxError("the bridge connection is closed")
        try:
            await self._writer.write(frame)
        except OSError as exc:
            raise SandboxError(f"lost the connection to the bridge: {exc}") from exc

    async def _next_frame(self) -> p.Frame:
        """One frame off the socket; log frames are handed to on_log and skipped."""
        while True:
            try:
                frame = await self._reader.read()
            except p.FrameTooLarge as exc:
                raise SandboxError(f"bridge sent an oversized frame: {exc}") from exc
            except p.ProtocolError as exc:
                log.warning("skipping a malformed bridge frame: %s", exc)
                continue
            except OSError as exc:
                raise SandboxError(f"lost the connection to the bridge: {exc}") from exc
            if frame is None:
                self.closed = True
                raise SandboxError("the bridge closed the connection (sandbox exited?)")
            if frame["type"] == p.LOG:
                self._on_log(frame)
                continue
            return frame

    async def _frame_for(self, fid: str) -> p.Frame:
        """The next frame for command `fid`; frames for other ids are parked for their owners."""
        while True:
            parked = self._parked.get(fid)
            if parked:
                return parked.popleft()
            async with self._read_lock:
                parked = self._parked.get(fid)
                if parked:
                    return parked.popleft()
                frame = await self._next_frame()
            owner = frame.get("id")
            if owner == fid:
                return frame
            if isinstance(owner, str) and owner in self._parked:
                self._parked[owner].append(frame)
            elif owner is None and frame["type"] == p.ERROR:
                log.warning("bridge error: %s", frame.get("error"))
            else:
                log.debug("dropping a bridge frame for an unknown command: %s", frame.get("type"))

    async def _request(self, frame: p.Frame, timeout: float | None) -> p.Frame:
        fid = frame["id"]
        self._parked[fid] = deque()
        try:
            await self._send(frame)
            async with asyncio.timeout(timeout):
                return await self._frame_for(fid)
        finally:
            self._parked.pop(fid, None)

    # -- commands ----------------------------------------------------------------------------
    async def init(self, config: dict[str, Any], timeout: float | None = 600.0) -> p.Frame:
        """Configure the engine (and run setup when config.runSetup). Returns the init_ok frame."""
        reply = await self._request(p.make(p.INIT, id=_new_id("init"), config=config), timeout)
        if reply["type"] != p.INIT_OK:
            raise SandboxError(str(reply.get("error") or f"bridge init failed: {reply}"))
        self.withdraws = reply.get("withdraw") is True
        return reply

    def start_query(self, prompt: str | list[dict[str, Any]], *, query_id: str, model: str | None = None,
                    include_partial_messages: bool = False, **extra: Any) -> bool:
        """Send the query now, without the loop (on the loop's thread): its frames are then read with
        `query(..., sent=True)`, or it is withdrawn (`withdraw`). False, and nothing sent, where the
        engine cannot withdraw a query or another frame is being written."""
        if self.closed or not self.withdraws:
            return False
        frame = _query_frame(prompt, query_id, model, include_partial_messages, extra)
        try:
            sent = self._writer.send_now(frame)
        except (OSError, p.ProtocolError):
            return False  # the connection is gone, or the frame too large: the turn's own send reports it
        if sent:
            self._parked[query_id] = deque()
        return sent

    async def withdraw(self, query_id: str) -> None:
        """End a query sent by `start_query` whose prompt could not be stored, and leave it out of
        the engine's conversation. Its frames are dropped."""
        self._parked.pop(query_id, None)
        with contextlib.suppress(SandboxError):  # the connection is gone, and the conversation with it
            await self._send(p.make(p.WITHDRAW, id=query_id))

    async def query(
        self,
        prompt: str | list[dict[str, Any]],
        *,
        model: str | None = None,
        include_partial_messages: bool = False,
        query_id: str | None = None,
        on_limits_check: LimitsHandler | None = None,
        sent: bool = False,
        **extra: Any,
    ) -> AsyncIterator[p.Frame]:
        """Yield the query's `message`/`error` frames and finally its `done` frame. The bridge's
        `limits_check` requests are answered here with what `on_limits_check` returns (nothing
        without one): the bridge waits for that answer before it goes on. `sent`: `start_query`
        sent it already (with the same `query_id`)."""
        qid = query_id or _new_id("q")
        if not sent:
            self._parked[qid] = deque()
        try:
            if not sent:
                await self._send(_query_frame(prompt, qid, model, include_partial_messages, extra))
            while True:
                frame = await self._frame_for(qid)
                if frame["type"] == p.LIMITS_CHECK:
                    notices = await on_limits_check() if on_limits_check is not None else []
                    await self._send(p.make(p.LIMITS_REPORT, id=qid, checkId=frame.get("checkId"),
                                            notices=notices))
                    continue
                yield frame
                if frame["type"] == p.DONE:
                    return
        finally:
            self._parked.pop(qid, None)

    async def interrupt(self, query_id: str, reason: str | None = None) -> None:
        """`reason` ends the query's error as `interrupted: <reason>` (protocol 2); plain `interrupted` without."""
        await self._send(p.make(p.INTERRUPT, id=query_id, reason=reason or None))


    async def exec(self, argv: list[str], timeout: float = 60.0) -> p.Frame:
        """Run a program in the workspace: {exitCode, stdout, stderr[, timedOut]}."""
        return await self._request(p.make(p.EXEC, id=_new_id("exec"), argv=argv, timeout=timeout), timeout + 10)

    async def ping(self, timeout: float = 10.0) -> None:
        await self._request(p.make(p.PING, id=_new_id("ping")), timeout)

    async def shutdown(self) -> None:
        with contextlib.suppress(SandboxError):
            await self._send(p.make(p.SHUTDOWN))

    async def close(self) -> None:
        if not self._sock.fileno() < 0:
            p.close_socket(self._sock, self._reader, self._writer)
        self.closed = True
