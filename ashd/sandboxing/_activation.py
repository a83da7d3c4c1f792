"""The bridge's listening socket, made by the launcher and handed to the sandbox (socket activation).

The launcher binds and listens at the sandbox's `run/bridge.sock` before the sandbox exists, and
the sandbox inherits the socket (`python -m ashd.bridge --listen-fd N`). So the server's connect
succeeds at once and its `hello` waits in the socket until the bridge reads it: no polling for a
socket file while the sandbox starts (a failed connect a millisecond, each a wake-up of the
server's loop, four sandboxes starting at once: docs/performance.md, twenty-fourth pass), and no
wait past the moment the bridge is up.

The socket file is the server's (root, 0600): code in the sandbox, which runs as the sandbox user,
cannot connect to its own bridge through it. The launcher closes its copy once the sandbox holds
one, so when the sandbox dies the socket dies with it, and a connection still waiting in its
queue is reset: a bridge that never came up is an error at once, not a timeout.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

BACKLOG = 8


def bridge_listener(path: Path) -> socket.socket:
    """A Unix stream socket listening at `path` (a stale file there is replaced), inheritable."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock
