"""The bridge's socket is the launcher's (socket activation), on both launch routes.

The launcher binds and listens at the sandbox's `run/bridge.sock` before the sandbox starts and the
bridge serves on the inherited socket: a connect succeeds at once and is answered once the bridge
is up (no polling for a socket file), the file is the server's and code in the sandbox cannot
connect to its own bridge through it, and the launcher keeps no copy, so a dead sandbox's socket
refuses at once instead of queueing connections nobody will take.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ashd.sandboxing import BridgeConnection, SandboxLauncher
from tests.fixtures.sandboxes import (
    bridge_exec,
    launch_bridge,
    route_launcher,  # noqa: F401 (the `launcher` fixture)
    stop_sandbox,
)

pytestmark = pytest.mark.sandbox

PROBE = """
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("/run/ashd/bridge.sock")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
else:
    print("connected")
"""


def test_a_connect_made_at_launch_is_answered_once_the_bridge_is_up(launcher: SandboxLauncher) -> None:
    proc = launch_bridge(launcher, "act-early")
    try:
        sock = proc.paths.bridge_socket
        info = os.stat(sock)  # there at once: the launcher's, not the sandbox user's
        assert stat.S_ISSOCK(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o600

        async def connect() -> int | None:
            conn = await BridgeConnection.connect(str(sock), timeout=60)
            try:
                await conn.ping()
                return conn.pid
            finally:
                await conn.close()

        pid = asyncio.run(connect())
        assert pid is not None, (proc.paths.logs / "sandbox.log").read_text()
        assert "inherited" in (proc.paths.logs / "sandbox.log").read_text()
    finally:
        stop_sandbox(proc)


def test_code_in_the_sandbox_cannot_connect_to_its_own_bridge(launcher: SandboxLauncher) -> None:
    """A new connection replaces the server's: the sandbox must not be able to make one."""
    proc = launch_bridge(launcher, "act-self")
    try:
        result = bridge_exec(proc, [sys.executable, "-I", "-c", PROBE])
        assert result["exitCode"] == 0, result
        assert str(result["stdout"]).strip() == "EACCES", result
    finally:
        stop_sandbox(proc)


def test_a_dead_sandboxs_socket_refuses_at_once(launcher: SandboxLauncher) -> None:
    """The launcher closed its copy of the listening socket: once the sandbox is gone nobody holds
    it, so a connect is refused rather than queued for a bridge that will never take it."""
    proc = launch_bridge(launcher, "act-dead")
    path = str(proc.paths.bridge_socket)
    proc.kill()
    proc.wait(30)
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(ConnectionRefusedError):
        s.connect(path)
    proc.cleanup()


def test_the_fork_servers_image_holds_none_of_the_servers_modules() -> None:
    """Every zygote sandbox is a fork of it: each fork copies its page tables and each exit unmaps
    them, so the server's stack (storage, SQLAlchemy, aiohttp's server, the launcher) stays out."""
    code = (
        "import sys; import ashd.zygote._fork_server; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'aiohttp', 'pyroute2', 'psutil', 'cryptography') "
        "or m.startswith(('ashd.sandboxing', 'ashd.storage', 'ashd.actors', 'ashd.http')))))"
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {root!r}); {code}"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""
