"""JSON-lines logging on stderr, which never waits for its reader (`_stderr.py`).

Level contract (docs/operations.md): ERROR = something failed that an operator must look at
(unhandled exception, data not stored); WARNING = degraded but handled (weak isolation, a sandbox
OOM-killed, an idle session culled, a client dropped); INFO = lifecycle an operator wants in the
log (start, stop, session created/paused/resumed/ended); DEBUG = everything else.
Operational lines of the interface (`resume_hit`, `timing`) are written by `emit_line` and are
never filtered by level.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import sys
import threading
from typing import Any, TextIO

from ashd._stderr import now_iso, stderr_writer

# Anything that looks like a bearer token or an API key is masked before it is written, so that a
# careless f-string can never leak a secret into the log stream.
_SECRET_RE = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6})[A-Za-z0-9_\-]+|(Bearer\s+)[^\s\"']+|(ashd_[A-Za-z0-9]{4})[A-Za-z0-9_\-]+"
)
_STD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_lock = threading.Lock()


def redact(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        return (m.group(1) or m.group(2) or m.group(3) or "") + "***"

    return _SECRET_RE.sub(repl, text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": now_iso(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | type(None)) else redact(str(value))
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class _StderrHandler(logging.Handler):
    """Records to the process's stderr without waiting for its reader (`_stderr.py`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stderr_writer().write((self.format(record) + "\n").encode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - logging's own rule: a failing record is reported, not raised
            self.handleError(record)


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines at `level` and above: to `stream`, or to stderr without ever blocking on it."""
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    if stream is None:
        atexit.register(_flush_at_exit)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log is one line per request; keep it at WARNING unless debugging.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING if level.lower() != "debug" else logging.DEBUG)


def _flush_at_exit() -> None:
    stderr_writer().flush(2.0)  # lines a stalled reader left in the backlog, if it takes them now


def emit_line(payload: dict[str, Any], stream: TextIO | None = None) -> None:
    """Write one operational JSON line (resume_hit, timing) to stderr, regardless of log level."""
    line = json.dumps(payload, default=str)
    if stream is None and sys.stderr is sys.__stderr__:  # the process's own stderr (not a test's capture)
        stderr_writer().write(line.encode() + b"\n")
        return
    with _lock:
        target = stream or sys.stderr
        target.write(line + "\n")
        target.flush()
