"""What a session's sandbox prints, kept: its agent's setup output and its stderr.

Setup lines come from the bridge as `log` frames with `source: "setup"` while `init` runs
(`SetupSink`); they are stored as they come, in small batches, and all of them before the session's
creation answers. The sandbox's stdout/stderr (the bridge's own log, the engine's and its MCP
servers' stderr) go to `<sandbox>/disk/logs/sandbox.log` on the host (`sandboxing/_launcher.py`);
`LogTails` follows that file for each live session once a second and stores its new lines.

Everything here is bounded and nothing trusts the sandbox: a line is cut at `MAX_LINE_CHARS`, a
setup stores at most `setup_max_lines` lines, a sweep reads at most `SWEEP_MAX_BYTES` of a file and
stores at most `SWEEP_MAX_LINES` of it (the rest is skipped with a `system` note saying so), and a
session keeps its newest `SERVICE_SESSION_LOG_LINES` lines (storage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ashd.errors import StorageError
from ashd.storage import LogLine, SessionLogs

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 4000
SWEEP_SECONDS = 1.0
SWEEP_MAX_BYTES = 256 * 1024
SWEEP_MAX_LINES = 500
_SYSTEM_SLACK = 8  # the bridge's own `system` lines (running, finished, cut) past the line cap


def cut(text: str, limit: int = MAX_LINE_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" … [line cut: {len(text) - limit} more characters]"


def _default_log(frame: dict[str, Any]) -> None:
    level = str(frame.get("level") or "info").lower()
    log.log(getattr(logging, level.upper(), logging.INFO), "bridge: %s", frame.get("message"))


class SetupSink:
    """The bridge connection's `on_log` while a session's sandbox is set up (called on the loop).

    Setup lines are batched and stored by one writer task at a time, in order; other log frames go
    to the server log as before. `finish()` stores what is left and, when lines were cut, a note.
    """

    def __init__(self, logs: SessionLogs, session_id: str, tenant: str, max_lines: int,
                 ready: asyncio.Future[Any] | None = None) -> None:
        self._logs = logs
        self._ready = ready  # the session's row being inserted: lines are stored once it is
        self.session_id = session_id
        self.tenant = tenant
        self.max_lines = max_lines
        self.taken = 0
        self.cut = 0
        self._pending: list[LogLine] = []
        self._writer: asyncio.Task[None] | None = None

    def __call__(self, frame: dict[str, Any]) -> None:
        if frame.get("source") != "setup":
            _default_log(frame)
            return
        stream = frame.get("stream")
        level = stream if stream in ("stdout", "stderr", "system") else "stdout"
        if self.taken >= self.max_lines + (_SYSTEM_SLACK if level == "system" else 0):
            self.cut += 1
            return
        self.taken += 1
        step = frame.get("step")
        # The bridge cuts long lines itself, adding a note: room for it here.
        self._pending.append(LogLine(level, cut(str(frame.get("message") or ""), MAX_LINE_CHARS + 64),
                                     step=str(step)[:64] if isinstance(step, str) else None))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        if self._ready is not None and not await stored(self._ready):
            self._pending.clear()  # the session was never stored: nothing to store its lines for
            return
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._logs.add(self.session_id, self.tenant, batch, source="setup")
            except StorageError as exc:  # a full data disk is an operator's outage, not a bug: no traceback
                log.warning("could not store setup output: %s", exc.message, extra={"sessionId": self.session_id})
            except Exception:
                log.exception("could not store setup output", extra={"sessionId": self.session_id})

    async def finish(self) -> None:
        if self.cut:
            self._pending.append(LogLine("system", f"setup output cut: {self.cut} more lines not stored (at most "
                                                   f"{self.max_lines} lines per setup: SERVICE_SETUP_LOG_LINES)",
                                         step="setup"))
            self.cut = 0
        writer = self._writer
        if writer is not None and not writer.done():
            await writer
        await self._write()


async def stored(ready: asyncio.Future[Any]) -> bool:
    """Wait for a session's row to be inserted; False when it was not (nothing is stored for it)."""
    await asyncio.wait([ready])
    return not ready.cancelled() and ready.exception() is None


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass
class _Tail:
    session_id: str
    tenant: str
    path: Path
    fd: int | None  # None until the sandbox has created its log file
    offset: int
    partial: bytes = b""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # A new session's row being inserted meanwhile (`SessionActor.create`): its lines wait in the
    # file until it is stored, and are not stored at all if it never is.
    ready: asyncio.Future[Any] | None = None
    # Set, under `lock`, when `detach` closes `fd`. A sweep or flush that took the tail before must
    # not touch it after: the number may be another file's by then (the next sandbox's log).
    closed: bool = False


class LogTails:
    """Follows the sandbox log file of each live session and stores its new lines (on the loop).

    The file is opened when the session gets its sandbox and read from its size then; the open
    descriptor keeps the file readable after the sandbox's directory goes (its disk is unmounted
    lazily), so `detach` still stores the last lines of a sandbox that died.
    """

    def __init__(self, logs: SessionLogs, interval: float = SWEEP_SECONDS) -> None:
        self.logs = logs
        self.interval = interval
        self._tails: dict[str, _Tail] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def setup_sink(self, session_id: str, tenant: str, max_lines: int,
                   ready: asyncio.Future[Any] | None = None) -> SetupSink:
        return SetupSink(self.logs, session_id, tenant, max_lines, ready)

    async def attach(self, session_id: str, tenant: str, path: Path, ready: asyncio.Future[Any] | None = None,
                     *, from_start: bool = False) -> None:
        """Follow `path` from its current end, or with `from_start` (a sandbox started for this
        session: all it wrote is the session's, however soon its first line came) from its start.
        `ready`: the session's row is being inserted (see `_Tail.ready`)."""
        await self.detach(session_id)
        try:
            fd: int | None = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            fd = None  # a sandbox started for this session: its process creates the file
        offset = os.fstat(fd).st_size if fd is not None and not from_start else 0
        self._tails[session_id] = _Tail(session_id, tenant, path, fd, offset, ready=ready)
        if self._sweeper is None and not self._closed:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def detach(self, session_id: str, path: Path | None = None) -> None:
        """Store what is left of the session's file (its last line too) and stop following it.
        With `path`, only if that is the file followed (not the next sandbox's, attached meanwhile)."""
        tail = self._tails.get(session_id)
        if tail is None or (path is not None and tail.path != path):
            return
        del self._tails[session_id]
        try:
            await self._collect(tail, final=True)
        finally:
            async with tail.lock:
                tail.closed = True
                if tail.fd is not None:
                    os.close(tail.fd)

    async def flush(self, session_id: str) -> None:
        """Store the session's new lines now (a reader asking for them should not wait a sweep)."""
        tail = self._tails.get(session_id)
        if tail is not None:
            await self._collect(tail, final=False)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.wait([self._sweeper], timeout=5)
        for session_id in list(self._tails):
            with contextlib.suppress(Exception):
                await self.detach(session_id)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.sweep()

    async def sweep(self) -> None:
        """Store every followed file's new lines."""
        for tail in list(self._tails.values()):
            try:
                await self._collect(tail, final=False)
            except StorageError as exc:  # a full data disk is an operator's outage, not a bug: no traceback
                log.warning("could not store sandbox log lines: %s", exc.message,
                            extra={"sessionId": tail.session_id})
            except Exception:
                log.exception("could not store sandbox log lines", extra={"sessionId": tail.session_id})

    async def _collect(self, tail: _Tail, *, final: bool) -> None:
        if tail.closed:
            return
        if not final and tail.fd is not None and os.fstat(tail.fd).st_size == tail.offset:
            return  # nothing new (the common case): no trip to a worker thread
        if tail.ready is not None:
            if not tail.ready.done() and not final:
                return  # the session's row is not stored yet: the lines wait in the file
            if not await stored(tail.ready):
                return
            tail.ready = None
        async with tail.lock:
            if tail.closed:
                return
            lines = await asyncio.to_thread(_read_new, tail, final)
            if lines:
                await self.logs.add(tail.session_id, tail.tenant, lines, source="sandbox")


def _read_new(tail: _Tail, final: bool) -> list[LogLine]:
    """The complete new lines of the file (the last partial one too when `final`), bounded."""
    if tail.fd is None:
        try:
            tail.fd = os.open(tail.path, _OPEN_FLAGS)
        except OSError:
            return []
    size = os.fstat(tail.fd).st_size
    if size < tail.offset:  # truncated: start over
        tail.offset, tail.partial = 0, b""
    if size == tail.offset and not (final and tail.partial):
        return []
    want = min(size - tail.offset, SWEEP_MAX_BYTES)
    data = os.pread(tail.fd, want, tail.offset)
    tail.offset += len(data)
    skipped_bytes = size - tail.offset
    if skipped_bytes > 0:
        tail.offset = size  # a flood: keep up with the file, say what was skipped
    chunk = tail.partial + data
    parts = chunk.split(b"\n")
    tail.partial = parts.pop()
    if (final and tail.partial) or len(tail.partial) > MAX_LINE_CHARS * 4:
        parts.append(tail.partial)
        tail.partial = b""
    texts = [p.decode(errors="replace").rstrip("\r") for p in parts]
    lines = [LogLine("stderr", cut(t)) for t in texts[:SWEEP_MAX_LINES]]
    skipped_lines = len(texts) - len(lines)
    if skipped_bytes > 0 or skipped_lines > 0:
        what = ", ".join(x for x in (f"{skipped_lines} lines" if skipped_lines else "",
                                     f"{skipped_bytes} bytes" if skipped_bytes else "") if x)
        lines.append(LogLine("system", f"sandbox output skipped: {what} (more than {SWEEP_MAX_LINES} lines or "
                                       f"{SWEEP_MAX_BYTES // 1024} KiB a second are not stored)"))
    return lines
