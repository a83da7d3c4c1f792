"""A blocking readiness probe for pre-warming: wait until the bridge has bound its socket.

Used from pool worker threads only (never the event loop). The probe never connects: the bridge
serves one connection at a time and a new one replaces the old, so a probe connecting late could
take the bridge away from the session that has just claimed the sandbox. The socket file appears
when the bridge binds it, right before it listens; a client that connects in between is refused
and retries (`BridgeConnection.connect`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_bridge_ready(socket_path: Path, timeout: float, alive: Callable[[], bool] | None = None,
                      stopping: Callable[[], bool] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.002
    while time.monotonic() < deadline:
        if (alive is not None and not alive()) or (stopping is not None and stopping()):
            return False
        if socket_path.is_socket():
            return True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return False
