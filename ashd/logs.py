"""JSON-lines logging on stderr.

Level contract (docs/operations.md): ERROR = something failed that an operator must look at
(unhandled exception, data not stored); WARNING = degraded but handled (weak isolation, a sandbox
OOM-killed, an idle session culled, a client dropped); INFO = lifecycle an operator wants in the
log (start, stop, session created/paused/resumed/ended); DEBUG = everything else.
Operational lines of the interface (`resume_hit`, `timing`) are written by `emit_line` and are
never filtered by level.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import threading
from typing import Any, TextIO

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


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _now(),
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


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log is one line per request; keep it at WARNING unless debugging.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING if level.lower() != "debug" else logging.DEBUG)


def emit_line(payload: dict[str, Any], stream: TextIO | None = None) -> None:
    """Write one operational JSON line (resume_hit, timing) to stderr, regardless of log level."""
    line = json.dumps(payload, default=str)
    with _lock:
        target = stream or sys.stderr
        target.write(line + "\n")
        target.flush()
