"""`RemoteBackend`: a `SessionBackend` over one runner's API (docs/protocol.md "Runner API").

Every call is one HTTP request to the runner with the internal secret. A refusal from the runner
comes back as the same ApiError (status and message); a runner that cannot be reached is a 503
naming it. A turn is read from the runner's SSE one frame at a time with a small read buffer, so at
most one frame is held here: a slow client slows the runner's agent, as in one process.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp

from ashd.backends._protocol import Bundle, Files, Frame, Message, NewSession, SessionView
from ashd.errors import (
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SandboxError,
    ServiceError,
    StorageFull,
    Unavailable,
)
from ashd.storage import AgentFile, FileEntry

# The runner's SSE is read in pieces this small: the socket is not drained faster than frames are
# handed on (aiohttp stops reading the socket once this much is buffered).
READ_BUFSIZE = 16 * 1024
# The largest single frame accepted from a runner (a turn's frames are bounded by its storage limits).
MAX_FRAME_BYTES = 64 * 1024 * 1024
# A runner sends an SSE comment every 15 s on a quiet turn: this much silence means it is gone.
STREAM_READ_TIMEOUT = 90.0
CONNECT_TIMEOUT = 10.0
# On a runner's 503 "shutting down": nothing was stored for the request, another runner may take it.
DRAINING_HEADER = "X-Runner-Draining"
# On a runner's 503 for a create or a fork while every one of its sandboxes runs a turn: refused before it
# stored anything (the coordinator's copy of its heartbeat was a moment old), another runner may take it.
FULL_HEADER = "X-Runner-Full"
_CHUNK = 256 * 1024

_BY_STATUS: dict[int, type[ServiceError]] = {
    400: BadRequest, 404: NotFound, 409: Conflict, 410: Gone, 413: PayloadTooLarge, 429: RateLimited,
    500: SandboxError, 503: Unavailable, 507: StorageFull,
}


class RunnerUnreachable(Unavailable):
    """The runner did not answer (connection refused or broken, timeout): 503 naming it."""


class RunnerDidNotTake(RunnerUnreachable):
    """The request never reached the runner's work (no connection, it is draining, or every sandbox
    of it runs a turn): nothing was stored for it, so another runner may take the same request."""


def _error(runner: str, status: int, body: bytes, headers: Any) -> ServiceError:
    try:
        message = str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace")[:500] or f"HTTP {status}"
    if status == 401:  # the client's key is fine: this coordinator and the runner disagree on the secret
        exc: ServiceError = ServiceError(f"runner {runner} refused this coordinator's internal secret; set the "
                                         "same SERVICE_INTERNAL_SECRET on coordinators and runners")
        exc.status_code = 502
        return exc
    if status == 503 and (headers.get(DRAINING_HEADER) or headers.get(FULL_HEADER)):  # nothing taken: try another
        return RunnerDidNotTake(message)
    extra = {k: v for k, v in headers.items() if k.lower() == "retry-after"}
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls(message, headers=extra or None)
    exc = ServiceError(message, headers=extra or None)
    exc.status_code = status
    return exc


class RunnerClient:
    """The one aiohttp ClientSession of this process for runner calls, and the secret they carry."""

    def __init__(self, secret: str, call_timeout: float, spool_dir: Path) -> None:
        self._secret = secret
        self.call_timeout = call_timeout  # a lifecycle call (create runs setup.sh): its whole budget
        self.spool_dir = spool_dir  # where downloaded bundles and files wait (on the data disk)
        self._session: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self._secret}"},
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                read_bufsize=READ_BUFSIZE)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class RemoteBackend:
    def __init__(self, client: RunnerClient, runner_id: str, address: str) -> None:
        self._client = client
        self.runner_id = runner_id
        self.address = address.rstrip("/")

    def _unreachable(self, exc: BaseException) -> RunnerUnreachable:
        why = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
        # No connection at all: the runner saw nothing. A broken one or a timeout: it may have.
        cls = RunnerDidNotTake if isinstance(exc, aiohttp.ClientConnectorError) else RunnerUnreachable
        return cls(f"runner {self.runner_id} ({self.address}) is unreachable: {why}; try again")

    def _timeout(self, seconds: float | None = None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT,
                                     sock_read=seconds or self._client.call_timeout)

    async def _call(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                    data: bytes | None = None) -> Any:
        try:
            async with self._client.http.request(
                    method, self.address + path, json=body if data is None else None, data=data, params=params,
                    timeout=self._timeout(),
                    headers={"Content-Type": "application/gzip"} if data is not None else None) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _error(self.runner_id, resp.status, raw, resp.headers)
                return json.loads(raw) if raw else None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    @staticmethod
    def _path(session_id: str, action: str = "") -> str:
        return f"/runner/sessions/{session_id}" + (f"/{action}" if action else "")

    # --- lifecycle -----------------------------------------------------------------------------
    async def create(self, new: NewSession) -> SessionView:
        body = {"sessionId": new.session_id, "tenant": new.tenant, "agentName": new.agent_name,
                "model": new.model, "config": new.config, "credentialId": new.credential_id,
                "encryptedEnv": _b64(new.encrypted_env)}
        return dict((await self._call("POST", "/runner/sessions", body))["session"])

    async def view(self, tenant: str, session_id: str) -> SessionView:
        return dict((await self._call("GET", self._path(session_id), params={"tenant": tenant}))["session"])

    async def _action(self, tenant: str, session_id: str, action: str, **extra: Any) -> Any:
        return await self._call("POST", self._path(session_id, action), {"tenant": tenant, **extra})

    async def resume(self, tenant: str, session_id: str) -> SessionView:
        return dict((await self._action(tenant, session_id, "resume"))["session"])

    async def pause(self, tenant: str, session_id: str) -> SessionView:
        return dict((await self._action(tenant, session_id, "pause"))["session"])

    async def stop(self, tenant: str, session_id: str) -> SessionView:
        return dict((await self._action(tenant, session_id, "stop"))["session"])

    async def end(self, tenant: str, session_id: str, *, purge: bool = False) -> SessionView:
        return dict((await self._action(tenant, session_id, "end", purge=purge))["session"])

    async def configure(self, tenant: str, session_id: str, changes: dict[str, Any]) -> SessionView:
        body = {"tenant": tenant, "changes": changes}
        return dict((await self._call("PATCH", self._path(session_id, "config"), body))["session"])

    async def interrupt(self, tenant: str, session_id: str) -> dict[str, Any]:
        return dict(await self._action(tenant, session_id, "interrupt"))

    async def fork(self, tenant: str, parent_id: str, child_id: str, encrypted_env: bytes | None) -> SessionView:
        answer = await self._action(tenant, parent_id, "fork", childId=child_id, encryptedEnv=_b64(encrypted_env))
        return dict(answer["session"])

    async def exec(self, tenant: str, session_id: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
        return dict(await self._action(tenant, session_id, "exec", argv=argv, timeoutS=timeout_s))

    async def write_files(self, tenant: str, session_id: str, target: str, files: list[AgentFile]) -> list[str]:
        answer = await self._action(tenant, session_id, "files", target=target,
                                    files=[{"path": f.path, "content": _b64(f.data)} for f in files])
        return [str(p) for p in answer["paths"]]

    async def restore_bundle(self, tenant: str, session_id: str, data: bytes) -> tuple[int, list[str]]:
        answer = await self._call("POST", self._path(session_id, "workspace"), params={"tenant": tenant}, data=data)
        return int(answer["restored"]), [str(s) for s in answer["skipped"]]

    async def bundle(self, tenant: str, session_id: str) -> Bundle:
        source, spool, size = await self._download(self._path(session_id, "workspace"), {"tenant": tenant})
        return Bundle(source, spool, size)

    async def files(self, tenant: str, session_id: str) -> Files:
        answer = await self._call("GET", self._path(session_id, "files"), params={"tenant": tenant})
        entries = [FileEntry(str(e["path"]), int(e["size"]), dt.datetime.fromisoformat(str(e["modifiedAt"])))
                   for e in answer["files"]]
        return Files(str(answer["source"]), RemoteFiles(self, asyncio.get_running_loop(), tenant, session_id,
                                                        entries))

    async def _download(self, path: str, params: dict[str, str]) -> tuple[str, BinaryIO, int]:
        """A binary answer, spooled to the data disk: (X-Service-Source, the open file, its size)."""
        spool = tempfile.TemporaryFile(dir=self._client.spool_dir)  # noqa: SIM115 - returned open
        try:
            async with self._client.http.get(self.address + path, params=params, timeout=self._timeout()) as resp:
                if resp.status >= 400:
                    raise _error(self.runner_id, resp.status, await resp.read(), resp.headers)
                size = 0
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    spool.write(chunk)
                    size += len(chunk)
                source = resp.headers.get("X-Service-Source", "sandbox")
            spool.seek(0)
            return source, spool, size
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            spool.close()
            raise self._unreachable(exc) from exc
        except BaseException:
            spool.close()
            raise

    # --- turns ---------------------------------------------------------------------------------
    async def message(self, tenant: str, session_id: str, message: Message) -> RemoteTurn:
        body = {"tenant": tenant, "content": message.content, "model": message.model,
                "includePartialMessages": message.include_partial_messages, "maxBudgetUsd": message.max_budget_usd,
                "options": message.options, "attachments": list(message.attachments)}
        try:
            resp = await self._client.http.post(self.address + self._path(session_id, "messages"), json=body,
                                                timeout=self._timeout(STREAM_READ_TIMEOUT),
                                                read_bufsize=READ_BUFSIZE)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        if resp.status >= 400:  # refused before any frame (not active, a turn already running)
            try:
                raw = await resp.read()
            finally:
                resp.release()
            raise _error(self.runner_id, resp.status, raw, resp.headers)
        return RemoteTurn(resp, self, session_id)

    async def replay(self, tenant: str, session_id: str, after: int) -> AsyncGenerator[Frame, None]:
        raise NotImplementedError("replay is served from the shared database (backends.stored_replay)")

    async def running_turns(self) -> int:
        return 0  # the runner's own: it waits for them when it stops


class RemoteTurn:
    """A turn's frames as the runner streams them; `detach()` hangs up (the runner's turn goes on and
    is stored, replayable from the shared database)."""

    def __init__(self, resp: aiohttp.ClientResponse, backend: RemoteBackend, session_id: str) -> None:
        self._resp = resp
        self._backend = backend
        self._session_id = session_id
        self._detached = False
        self._done = False

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._frames()

    async def _frames(self) -> AsyncGenerator[Frame, None]:
        content = self._resp.content
        while not self._done:
            try:
                block = await content.readuntil(b"\n\n", max_size=MAX_FRAME_BYTES)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                if self._detached:
                    return
                raise self._broken(exc) from exc
            if not block:
                break
            frame = parse_frame(block)
            if frame is None:
                continue  # a comment (the runner's keep-alive) or an empty block
            if frame.event == "done":
                self._done = True
            yield frame
        if not self._done and not self._detached:
            raise self._broken(None)

    def _broken(self, exc: BaseException | None) -> RunnerUnreachable:
        why = f": {exc}" if exc is not None and str(exc) else ""
        return RunnerUnreachable(
            f"runner {self._backend.runner_id} ended the turn's stream before its end{why}; what it stored can be "
            f"read with GET /api/sessions/{self._session_id}/stream (Last-Event-ID)")

    def detach(self) -> None:
        self._detached = True
        if self._done:
            self._resp.release()
        else:
            self._resp.close()  # the runner sees the hang-up, detaches, and stores the rest


def parse_frame(block: bytes) -> Frame | None:
    """One SSE block (`id:`, `event:`, `data:` lines) as a Frame; None for comments and empty blocks."""
    event, data_lines, event_id = "message", [], None
    for line in block.decode().split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data_lines.append(value)
        elif name == "id":
            event_id = int(value) if value.isdigit() else None
    if not data_lines:
        return None
    return Frame(event, "\n".join(data_lines), event_id)


class RemoteFiles:
    """`FileSource` over the runner's files endpoints; its calls run in a worker thread (as the file
    endpoints call any reader), so each one waits for its request on the event loop."""

    def __init__(self, backend: RemoteBackend, loop: asyncio.AbstractEventLoop, tenant: str, session_id: str,
                 entries: list[FileEntry]) -> None:
        self._backend = backend
        self._loop = loop
        self._tenant = tenant
        self._session_id = session_id
        self._entries = entries

    def list_files(self) -> list[FileEntry]:
        return list(self._entries)

    def _params(self, rel: str, fmt: str) -> tuple[str, dict[str, str]]:
        from urllib.parse import quote

        return (self._backend._path(self._session_id, "files/" + quote(rel)),
                {"tenant": self._tenant, "format": fmt})

    def open_file(self, rel: str) -> tuple[BinaryIO, int]:
        path, params = self._params(rel, "raw")
        _, stream, size = asyncio.run_coroutine_threadsafe(self._backend._download(path, params), self._loop).result()
        return stream, size

    def read_for_json(self, rel: str, limit: int = 0) -> str:
        path, params = self._params(rel, "json")
        answer = asyncio.run_coroutine_threadsafe(self._backend._call("GET", path, params=params), self._loop).result()
        return str(answer["content"])

    def close(self) -> None:
        pass


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()
