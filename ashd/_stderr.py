"""The process's stderr, written without ever waiting for its reader.

The server logs to stderr, which in production is a pipe (a container runtime's log driver) or a
socket (journald). When that reader stalls, a plain write blocks once the pipe's 64 KiB or the
socket's buffer is full, and a write on the event loop's thread then stalls every request. Here
a line goes out at once with a write that does not wait (one system call, as before); what the
reader has no room for waits in a bounded backlog that a thread of its own writes, in order, as
the reader takes it. Lines past the bound are dropped and counted, and a warning says how many
once the reader is back: a log that stalls costs log lines, never the service.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import socket
import stat
import threading
from collections import deque
from collections.abc import Callable

MAX_BACKLOG = 8 * 1024 * 1024  # bytes of lines held for a reader that stalled


def now_iso() -> str:
    """Now, as every log line's `ts` says it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _send_without_waiting(fd: int) -> Callable[[bytes], int]:
    """A write to `fd` that returns what fit rather than wait (BlockingIOError when nothing did).
    The descriptor's own flags stay as they are: other processes may share its file description."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return lambda data: os.write(fd, data)
    if stat.S_ISFIFO(mode):
        try:  # a description of our own on the same pipe, non-blocking
            own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            pass
        else:
            return lambda data: os.write(own, data)
    elif stat.S_ISSOCK(mode):
        sock = socket.socket(fileno=os.dup(fd))
        return lambda data: sock.send(data, socket.MSG_DONTWAIT)
    # A file or a terminal: its write waits for the disk or the terminal, not for a reader.
    return lambda data: os.write(fd, data)


class StderrWriter:
    """Lines to `fd`, never blocking the caller (see the module's docstring)."""

    def __init__(self, fd: int = 2, max_backlog: int = MAX_BACKLOG) -> None:
        self._fd = fd
        self._send = _send_without_waiting(fd)
        self._max = max_backlog
        self._lock = threading.Condition(threading.Lock())
        self._backlog: deque[bytes] = deque()
        self._held = 0  # bytes in the backlog
        self._writing = False  # the thread holds lines taken from the backlog
        self._dropped = 0
        self._thread: threading.Thread | None = None

    def write(self, line: bytes) -> None:
        with self._lock:
            if not self._backlog and not self._writing:
                try:
                    sent = self._send(line)
                except BlockingIOError:
                    sent = 0
                except InterruptedError:
                    sent = 0
                except OSError:
                    return  # stderr is closed: there is no one to tell
                if sent >= len(line):
                    return
                if sent:  # the rest of a line begun is always kept: a torn line would not parse
                    self._hold(line[sent:])
                    return
            if self._held + len(line) > self._max:
                self._dropped += 1
                return
            self._hold(line)

    def _hold(self, data: bytes) -> None:
        self._backlog.append(data)
        self._held += len(data)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stderr-writer", daemon=True)
            self._thread.start()
        else:
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._backlog and not self._dropped:
                    self._writing = False
                    self._lock.notify_all()  # `flush` waits for this
                    self._lock.wait()
                self._writing = True
                chunk = b"".join(self._backlog)
                self._backlog.clear()
                self._held = 0
                dropped, self._dropped = self._dropped, 0
            if chunk:
                self._write_all(chunk)
            if dropped:
                self._write_all(json.dumps({
                    "ts": now_iso(), "level": "warning", "logger": "ashd.logs",
                    "msg": f"{dropped} log lines dropped: stderr's reader did not keep up",
                    "dropped": dropped}).encode() + b"\n")

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except (BlockingIOError, InterruptedError):
                select.select([], [self._fd], [], 1.0)  # a descriptor another process made non-blocking
            except OSError:
                return  # closed: what is left has no reader

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the backlog to be written; True when it was."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._backlog and not self._writing and not self._dropped,
                                       timeout)


_writer: StderrWriter | None = None
_writer_lock = threading.Lock()


def stderr_writer() -> StderrWriter:
    """The process's writer for fd 2, made on first use."""
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = StderrWriter()
        return _writer
