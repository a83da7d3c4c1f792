"""The bridge's client of the Messages API: one streamed `POST /v1/messages`, its SSE events as dicts.

The engine needs one request shape and the raw events. The anthropic SDK built each request's
parameters through its type transforms and each event into a pydantic model that the engine turned
back into a dict: 0.89 ms of a model call against 0.21 ms for the same request and events here
(measured in process, 10 messages and 10 tools, 13 events), and pages of code and validators that
every sandbox's bridge touched on its turns. The errors keep what the engine decides on: the HTTP
status, the headers (the model proxy's refusal, `retry-after`) and the API's error body.

In a sandbox the one server is the model proxy on a unix socket (ours: aiohttp), and there the
request is written and its reply read straight off the socket (`_UnixHttp`): one request per
connection, `Connection: close`, the chunked body decoded as it comes, so a cut stream is still
told from an ended one. httpx2 spent 0.5 ms of a call on its own machinery (0.66 ms a call
against 0.17 for the socket itself, measured in process against an aiohttp server), on every
model call of every turn. Without a socket (a base URL, TLS) httpx2 does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import httpx2

from ashd import compact_json
from ashd.bridge.engine._background import retrieve

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]
API_VERSION = "2023-06-01"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # between two reads: a long non-streaming reply may take minutes
DEFAULT_TIMEOUT = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)


# An `error` event inside a 200 stream names its type, not a status: the status the API gives the same
# error as a response, so the retry rules read both alike.
_STATUS_OF_ERROR = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403, "not_found_error": 404,
    "request_too_large": 413, "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529,
}


class ApiError(Exception):
    """A model call that failed; `message` is the reason for people."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiConnectionError(ApiError):
    """The model proxy could not be reached, or the connection broke."""


class ApiTimeoutError(ApiConnectionError):
    """The model proxy did not answer in time."""


class ApiStatusError(ApiError):
    """The API (or the model proxy) answered with an error: `status`, its `headers`, and `body` (the
    parsed JSON error, else None)."""

    def __init__(self, message: str, status: int, headers: Mapping[str, str], body: Any) -> None:
        super().__init__(message)
        self.status_code = status
        self.headers = headers
        self.body = body


def _status_error(status: int, headers: Mapping[str, str], raw: bytes) -> ApiStatusError:
    text = raw.decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return ApiStatusError(f"Error code: {status} - {body if body is not None else text}", status, headers, body)


class EncodedList(list[Any]):
    """A list of a request whose JSON text is already known (`json`): the request is encoded with
    that text in its place instead of encoding the list again (the tools, the same on every call)."""

    json: str


def encoded_list(items: list[Any]) -> EncodedList:
    out = EncodedList(items)
    out.json = _dumps(items)
    return out


_dumps = compact_json.dumps


def encode_request(params: dict[str, Any]) -> bytes:
    """The request body: `params` as JSON, its EncodedList values written as they were encoded."""
    if not any(type(v) is EncodedList for v in params.values()):
        return _dumps(params).encode()
    fields = [f"{_dumps(k)}:{v.json if type(v) is EncodedList else _dumps(v)}" for k, v in params.items()]
    return ("{" + ",".join(fields) + "}").encode()


class _Headers(dict[str, str]):
    """Response headers by lower-case name; `get` takes any case, as HTTP names are."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


class _Reply(Protocol):
    status_code: int
    headers: Mapping[str, str]

    def lines(self) -> AsyncGenerator[str, None]: ...

    async def read(self) -> bytes: ...


class _UnixHttp:
    """One HTTP/1.1 request per connection to a server on a unix socket (the model proxy).

    The next call's connection is opened ahead (`preconnect`: at the engine's start, and after each
    call), while nothing waits for it: a connect here is 0.35 ms of asyncio's machinery in the
    bridge and an accept in the server's loop, on the path of every model call otherwise
    (docs/performance.md, twelfth pass). The proxy closes a connection that carried no request when
    it stops, or after its keep-alive time (aiohttp's: an hour): such a connection is seen closed
    before it is used, or, closed in the moment of its use, answers nothing, and the call is sent
    again on a new one."""

    def __init__(self, socket_path: str) -> None:
        self._socket = socket_path
        self._spare: asyncio.Task[tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None = None
        self._closed = False  # a call that ends after `close` opens nothing ahead for a next one

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_unix_connection(self._socket)
        except TimeoutError as exc:
            raise ApiTimeoutError("Request timed out: no connection to the model proxy") from exc
        except OSError as exc:
            raise ApiConnectionError(f"Connection error: {exc}") from exc

    def preconnect(self) -> None:
        """Open the next call's connection now, unless one is open or opening, or the client is
        closed."""
        if self._spare is None and not self._closed:
            self._spare = asyncio.get_running_loop().create_task(self._connect())
            # One that fails to open is no error of its own: the call that takes it connects anew.
            self._spare.add_done_callback(retrieve)

    async def _take_spare(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        try:
            reader, writer = await spare  # done by now, as a rule; else the connect under way
        except ApiConnectionError:
            return None  # said again, if it still holds, by the new connection's own error
        if reader.at_eof() or writer.is_closing():
            writer.close()
            return None
        return reader, writer

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> _UnixReply:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = (f"POST {path} HTTP/1.1\r\nhost: model-proxy\r\nconnection: close\r\n{head}"
                   f"content-length: {len(body)}\r\n\r\n").encode("latin-1") + body
        spare = await self._take_spare()
        if spare is not None:
            try:
                return await self._send(spare, request)
            except ApiConnectionError as exc:
                if not _unanswered(exc):
                    raise
        return await self._send(await self._connect(), request)

    async def _send(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> _UnixReply:
        reader, writer = conn
        reply = _UnixReply(reader, writer, asyncio.get_running_loop())
        try:
            writer.write(request)
            await reply.start()
        except BaseException:
            reply.close()
            raise
        return reply

    def close(self) -> None:
        self._closed = True
        spare, self._spare = self._spare, None
        if spare is None:
            return
        if spare.done():
            if not spare.cancelled() and spare.exception() is None:
                spare.result()[1].close()
        else:
            spare.cancel()


def _unanswered(exc: ApiConnectionError) -> bool:
    """Whether a call on an opened-ahead connection failed before one byte of a reply: the proxy had
    closed it (the call never reached it), so it may be sent again on a new connection."""
    if isinstance(exc, ApiTimeoutError):
        return False
    cause = exc.__cause__
    if isinstance(cause, asyncio.IncompleteReadError):
        return not cause.partial
    return isinstance(cause, ConnectionResetError | BrokenPipeError)


class _UnixReply:
    """A reply read off the socket: its status and headers, then its body as it comes (chunked, of
    a known length, or to the connection's end). A body cut short is an ApiConnectionError."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._reader, self._writer, self._loop = reader, writer, loop
        self.status_code = 0
        self._headers = _Headers()
        self.headers: Mapping[str, str] = self._headers

    async def _io(self, read: Awaitable[bytes]) -> bytes:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                return await read
        except TimeoutError as exc:
            raise ApiTimeoutError(f"Request timed out: nothing read for {READ_TIMEOUT_S:g} s") from exc
        except asyncio.IncompleteReadError as exc:
            raise ApiConnectionError("Connection error: the model proxy closed the connection mid-reply") from exc
        except (OSError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ApiConnectionError(f"Connection error: {exc}") from exc

    async def start(self) -> None:
        head = await self._io(self._reader.readuntil(b"\r\n\r\n"))
        status_line, *fields = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ApiConnectionError(f"Connection error: not an HTTP reply: {status_line[:100]!r}")
        self.status_code = int(parts[1])
        for field in fields:
            name, sep, value = field.partition(":")
            if sep:
                self._headers[name.strip().lower()] = value.strip()

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        reader = self._reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self._io(reader.readuntil(b"\r\n"))
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError as exc:
                    raise ApiConnectionError(f"Connection error: a bad chunk size {size_line[:40]!r}") from exc
                if size == 0:
                    while await self._io(reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    return
                chunk = await self._io(reader.readexactly(size + 2))
                yield chunk[:-2]
        elif (length := self.headers.get("content-length")) is not None:
            yield await self._io(reader.readexactly(int(length)))
        else:
            while chunk := await self._io(reader.read(65536)):
                yield chunk

    async def lines(self) -> AsyncGenerator[str, None]:
        pending = b""
        async with contextlib.aclosing(self.chunks()) as chunks:  # left at `message_stop`: see _read_events
            async for chunk in chunks:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.removesuffix(b"\r").decode("utf-8", "replace")

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        self._writer.close()


class _HttpxReply:
    def __init__(self, resp: httpx2.Response) -> None:
        self._resp = resp
        self.status_code = resp.status_code
        self.headers: Mapping[str, str] = resp.headers

    async def lines(self) -> AsyncGenerator[str, None]:
        async with contextlib.aclosing(self._resp.aiter_lines()) as lines:  # type: ignore[type-var]
            async for line in lines:
                yield line

    async def read(self) -> bytes:
        return await self._resp.aread()


class ModelClient:
    """Streams Messages API requests to the model proxy: over its unix socket (`unix`), else through
    `http` to `base_url`."""

    def __init__(self, http: httpx2.AsyncClient | None, base_url: str = "http://model-proxy",
                 unix: str | None = None) -> None:
        self._http = http
        self._unix = _UnixHttp(unix) if unix else None
        self._url = base_url.rstrip("/") + "/v1/messages"

    async def stream(self, params: dict[str, Any], betas: list[str],
                     on_event: OnEvent) -> None:
        """Send `params` as a streamed request; `on_event` gets each event (`ping` left out) in order.
        An `error` event ends the stream with an `ApiStatusError`."""
        # The model proxy replaces the key with the session's real credential.
        headers = {"content-type": "application/json", "accept": "text/event-stream",
                   "anthropic-version": API_VERSION, "x-api-key": "sandbox-no-key"}
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
        body = encode_request({**params, "stream": True})
        if self._unix is not None:
            reply = await self._unix.post("/v1/messages", body, headers)
            try:
                await _read_reply(reply, on_event)
            finally:
                reply.close()
                self._unix.preconnect()
            return
        assert self._http is not None
        try:
            async with self._http.stream("POST", self._url, content=body, headers=headers) as resp:
                await _read_reply(_HttpxReply(resp), on_event)
        except httpx2.TimeoutException as exc:
            raise ApiTimeoutError(f"Request timed out: {exc}") from exc
        except httpx2.TransportError as exc:
            raise ApiConnectionError(f"Connection error: {exc}" if str(exc) else "Connection error.") from exc

    def preconnect(self) -> None:
        """Open the next model call's connection ahead (the model proxy's socket only)."""
        if self._unix is not None:
            self._unix.preconnect()

    async def close(self) -> None:
        if self._unix is not None:
            self._unix.close()
        if self._http is not None:
            await self._http.aclose()


async def _read_reply(reply: _Reply, on_event: OnEvent) -> None:
    if reply.status_code >= 300:
        raise _status_error(reply.status_code, reply.headers, await reply.read())
    await _read_events(reply, on_event)


async def _read_events(reply: _Reply, on_event: OnEvent) -> None:
    """Server-sent events: `data:` lines (joined by newlines) end at a blank line; `event:` names it.

    The message is whole at its `message_stop` event: the reply is not read further. What follows
    it on the wire is the body's framing (the last chunk), and waiting for it made every model call
    wait for the model proxy's bookkeeping of the call, which it does before it ends the body.

    The line reader left there is closed here, not by the garbage collector: asyncio has a suspended
    async generator that is collected closed by a task it schedules thread-safely (the loop's
    self-pipe written and read, a task run), on the path from the reply's last event to the
    assistant message's frame."""
    event = ""
    data: list[str] = []
    async with contextlib.aclosing(reply.lines()) as lines:
        async for line in lines:
            if line:
                field, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if field == "data":
                    data.append(value)
                elif field == "event":
                    event = value
                continue
            if data and await _dispatch(event, "\n".join(data), reply.headers, on_event):
                return
            event, data = "", []
    if data:
        await _dispatch(event, "\n".join(data), reply.headers, on_event)


async def _dispatch(event: str, data: str, headers: Mapping[str, str], on_event: OnEvent) -> bool:
    """Hand on one event; True when it ends the message (`message_stop`)."""
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise ApiError(f"the model stream sent an event that is not JSON: {data[:200]!r}") from exc
    kind = event or (parsed.get("type") if isinstance(parsed, dict) else None)
    if kind == "ping":
        return False
    if kind == "error" or (isinstance(parsed, dict) and parsed.get("type") == "error"):
        error = parsed.get("error") if isinstance(parsed, dict) else None
        status = _STATUS_OF_ERROR.get(str(error.get("type")) if isinstance(error, dict) else "", 500)
        raise ApiStatusError(f"Error in the model stream: {parsed}", status, headers, parsed)
    if not isinstance(parsed, dict):
        raise ApiError(f"the model stream sent an event that is not an object: {data[:200]!r}")
    await on_event(parsed)
    return kind == "message_stop"


def make_client(model_socket: str | None, base_url: str = "http://model-proxy") -> ModelClient:
    if model_socket:
        return ModelClient(None, base_url, unix=model_socket)
    return ModelClient(httpx2.AsyncClient(timeout=DEFAULT_TIMEOUT), base_url)
