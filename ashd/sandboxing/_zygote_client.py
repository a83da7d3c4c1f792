"""The server's side of the fork server: start it, ask it to spawn, learn when children exit."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import ashd
from ashd.errors import SandboxError

# The zygote runs the server's own ashd, from where this process imported it. `-I` keeps the
# environment out of it (no PYTHONPATH), so a server started from a checkout, or from a copy as
# the mutation tests do, would otherwise fork sandboxes from whatever ashd the interpreter's
# site-packages holds; the sandbox binds the server's package, so lazy imports would break too.
ASHD_PACKAGE = os.path.dirname(os.path.abspath(ashd.__file__))
ASHD_ROOT = os.path.dirname(ASHD_PACKAGE)
ZYGOTE_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
               "from ashd.zygote._fork_server import main; sys.exit(main(sys.argv[1:]))")
log = logging.getLogger(__name__)

DEFAULT_PAYLOAD = "ashd.bridge.__main__:main"
BOOT_TIMEOUT = 60.0
SPAWN_TIMEOUT = 10.0


class ZygoteChild:
    """A zygote child as seen from the server: its exit status arrives over the zygote socket."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._done = threading.Event()
        self._status: int | None = None

    def set_status(self, status: int) -> None:
        self._status = status
        self._done.set()

    def poll_status(self) -> int | None:
        return self._status if self._done.is_set() else None

    def wait_status(self, timeout: float | None) -> int | None:
        self._done.wait(timeout)
        return self.poll_status()


class ZygoteClient:
    def __init__(self, log_path: Path, payload: str = DEFAULT_PAYLOAD, detach_under: tuple[str, ...] = ()) -> None:
        """`detach_under`: folders whose mounts stay out of the zygote's own mount namespace (the
        sandboxes' disks, the networked sandboxes' netns: `private_mount_namespace`)."""
        self.log_path = log_path
        self.payload = payload
        self.detach_under = detach_under
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.has_payload = False

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    @property
    def pid(self) -> int | None:
        """The fork server's pid while it runs (operators' tools and tests)."""
        return self._proc.pid if self.alive() and self._proc is not None else None

    def start(self) -> None:
        """Call from the launcher's long-lived spawner thread: the zygote's PDEATHSIG follows the
        thread that forked it."""
        if self._sock is not None or self._proc is not None:
            self.stop()  # a previous zygote that died: its socket closed, its reader gone
        # Each zygote's reader keeps its own socket, replies and children: a previous one's reader,
        # still draining a dead zygote's socket, would otherwise read the new socket or answer the
        # new zygote's spawns with its "exited" (seen under a loaded CI, when it woke late).
        replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._replies = replies
        children: dict[int, ZygoteChild] = {}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-c",
                    ZYGOTE_BOOT,
                    ASHD_ROOT,
                    str(theirs.fileno()),
                    str(os.getpid()),
                    self.payload,
                    *self.detach_under,
                ],
                pass_fds=[theirs.fileno()],
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                cwd="/",
            )
        theirs.close()
        self._sock = ours
        self._reader = threading.Thread(target=self._read, args=(ours, replies, children),
                                        name="ashd-zygote-reader", daemon=True)
        self._reader.start()
        try:
            hello = replies.get(timeout=BOOT_TIMEOUT)
        except queue.Empty:
            self.stop()
            raise SandboxError(f"the sandbox fork server did not start; see {self.log_path}") from None
        if not hello.get("ready"):
            raise SandboxError(f"the sandbox fork server failed to start: {hello}; see {self.log_path}")
        if hello.get("ashd") != ASHD_PACKAGE:
            self.stop()
            raise SandboxError(f"the sandbox fork server runs ashd from {hello.get('ashd')}, this server from "
                               f"{ASHD_PACKAGE}: the sandboxes would run other code than the server")
        self.has_payload = bool(hello.get("payload"))
        log.info("sandbox zygote %d ready (payload %s)", hello.get("pid"), self.payload)

    def _read(self, sock: socket.socket, replies: queue.Queue[dict[str, Any]],
              children: dict[int, ZygoteChild]) -> None:
        buf = b""
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    with self._lock:
                        child = children.pop(msg["exit"], None)
                    if child is not None:
                        child.set_status(int(msg["status"]))
                    continue
                if "pid" in msg:
                    # Registered here, in socket order, so its exit can never be seen first.
                    msg["child"] = ZygoteChild(msg["pid"])
                    with self._lock:
                        children[msg["pid"]] = msg["child"]
                replies.put(msg)
        # The zygote is gone: its children died with it (PDEATHSIG SIGKILL).
        with self._lock:
            orphans = list(children.values())
            children.clear()
        for child in orphans:
            child.set_status(-9)
        replies.put({"error": "the sandbox fork server exited"})

    def spawn(self, request: dict[str, Any], pass_fd: int | None = None) -> ZygoteChild:
        """`pass_fd`: an fd the sandbox's payload gets as fd 3 (`PASSED_FD`), sent with the request."""
        with self._lock:
            sock = self._sock
        if sock is None or not self.alive():
            raise SandboxError("the sandbox fork server is not running")
        line = json.dumps({"spawn": request}).encode() + b"\n"
        with self._spawn_lock:
            if pass_fd is None:
                sock.sendall(line)
            else:
                # The fd rides on the first byte sent; one request at a time (this lock, and the
                # wait for its reply below) keeps it with its own request on the zygote's side.
                sent = socket.send_fds(sock, [line], [pass_fd])
                sock.sendall(line[sent:])
            try:
                reply = self._replies.get(timeout=SPAWN_TIMEOUT)
            except queue.Empty:
                raise SandboxError("the sandbox fork server did not answer") from None
        if "pid" not in reply:
            raise SandboxError(f"the sandbox fork server could not start a sandbox: {reply.get('error')}")
        child: ZygoteChild = reply["child"]
        return child

    def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
