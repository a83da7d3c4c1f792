"""A blocking readiness probe for pre-warming: connect to the bridge socket and exchange hello/ready.

Used from pool worker threads only (never the event loop). The bridge accepts a new connection
after this one closes, so the session that claims the sandbox later connects normally.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from ashd.bridge.protocol import PROTOCOL_VERSION


def wait_bridge_ready(socket_path: Path, timeout: float, alive: object = None) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.002
    while time.monotonic() < deadline:
        if callable(alive) and not alive():
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect(str(socket_path))
                sock.sendall(json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION}).encode() + b"\n")
                line = sock.makefile("rb").readline(1 << 20)
                if line and json.loads(line).get("type") == "ready":
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return False
