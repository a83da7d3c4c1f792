"""A blocking readiness probe for a pool without a warmer: wait until the bridge's socket file is there.

The server's pool always has a warmer, whose connection to a spare's bridge is the probe (the
`ready` answer to its `hello`): the launcher makes the socket before the sandbox starts (socket
activation, `sandboxing/_activation.py`), so the file alone says only that the launch happened.
This probe is what a pool made without one (tests of the pool alone) waits for: it never
connects, because the bridge serves one connection at a time and a probe connecting late could
take the bridge away from the session that has just claimed the sandbox.
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
