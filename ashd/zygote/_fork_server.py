"""The fork server: `python -I -c ZYGOTE_BOOT <ashd root> <fd> <server pid> <module:function> [<dir>...]`,
the dirs those whose mounts its own mount namespace leaves out (`child.private_mount_namespace`).

Started once with an empty environment (a forked child's /proc/self/environ shows the zygote's
original environment block, so no secret may ever be in it). It pre-imports the heavy modules,
freezes the GC so copy-on-write pages stay shared, then serves newline-delimited JSON on the
inherited socket:

    <- {"ready": true, "pid": N, "payload": bool, "ashd": "<the ashd package it imported>"}
    -> {"spawn": {...request...}}        <- {"pid": N} | {"error": "..."}
       (with at most one fd in SCM_RIGHTS: the bridge's listening socket, fd 3 in the sandbox)
                                         <- {"exit": N, "status": <Popen-style returncode>}

It reaps its children itself (it is their parent) and reports every exit, so the server can tell
an OOM kill from other deaths. It must stay single-threaded: it forks.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import ashd
from ashd.zygote import _child as child

# The bridge imports its engine lazily in main(); importing it here is what makes a spawn cheap.
PRELOAD = ("httpx2", "ashd.bridge._server")


def _load_entry(spec: str) -> Callable[[list[str]], object] | None:
    module, _, func = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        print(f"zygote: payload {module} not importable yet: {exc}", file=sys.stderr)
        return None
    # The payload may name the modules it imports lazily, so the zygote can import them once.
    for name in getattr(mod, "ZYGOTE_PRELOAD", ()):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"zygote: cannot preload {name}: {exc}", file=sys.stderr)
    # And may warm up what its children's first request would build (paid once here, shared by all).
    warm = getattr(mod, "zygote_warm", None)
    if callable(warm):
        try:
            warm()
        except Exception as exc:  # noqa: BLE001 - a warm-up is an optimisation: the children work without it
            print(f"zygote: warm-up failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    entry = getattr(mod, func, None)
    return entry if callable(entry) else None


class _Zygote:
    def __init__(self, sock: socket.socket, entry: Callable[[list[str]], object] | None) -> None:
        self.sock = sock
        self.entry = entry
        self.pid = os.getpid()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.buf = b""
        self.fds: list[int] = []  # received with the request being read; the client sends one at a time
        self.clone_into_cgroup = True

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def spawn(self, req: dict[str, Any], passed: list[int]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = self._fork(req)
        if pid == 0:
            try:
                child.reset_after_fork(self.sock, [self.wake_r, self.wake_w], keep=passed[0] if passed else None)
                child.redirect_stdio(req["log"])
                child.sandbox_main(req, self.pid, self.entry)
            finally:
                os._exit(127)
        return pid

    def _fork(self, req: dict[str, Any]) -> int:
        """The sandbox's init, born in its cgroup where the kernel can (v2, Linux 5.7+), else it
        joins the cgroup itself; `req["born_in_cgroup"]` tells it which."""
        req["born_in_cgroup"] = False
        if req.get("cgroup_dir") and self.clone_into_cgroup:
            fd = os.open(req["cgroup_dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                req["born_in_cgroup"] = True  # as the child sees it, once the clone succeeds
                return child.fork_into_new_pid_namespace(fd)
            except OSError as exc:  # nothing was forked: the old way below
                req["born_in_cgroup"] = False
                if exc.errno in (errno.ENOSYS, errno.EINVAL, errno.E2BIG):
                    self.clone_into_cgroup = False  # this kernel has no clone3 or no CLONE_INTO_CGROUP
            finally:
                os.close(fd)  # the parent's, and the child's copy of it
        return child.fork_into_new_pid_namespace()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"exit": pid, "status": os.waitstatus_to_exitcode(status)})

    def handle(self, line: bytes) -> None:
        passed, self.fds = self.fds, []
        try:
            req = json.loads(line)
            if len(passed) > 1:
                raise ValueError(f"a spawn takes at most one fd, got {len(passed)}")
            self.send({"pid": self.spawn(req["spawn"], passed)})
        except Exception as exc:  # noqa: BLE001  (the server gets the reason; the zygote lives on)
            self.send({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in passed:  # the child has its copy now
                os.close(fd)

    def serve(self) -> None:
        self.send({"ready": True, "pid": self.pid, "payload": self.entry is not None,
                   "ashd": os.path.dirname(os.path.abspath(ashd.__file__))})
        while True:
            try:
                ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                self.reap()
            if self.sock.fileno() in ready:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 20, 4)
                self.fds += fds
                if not data:
                    return  # the server went away: our children die with us (PDEATHSIG)
                self.buf += data
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    self.handle(line)
            self.reap()


def main(argv: list[str]) -> int:
    fd, server_pid, payload = int(argv[0]), int(argv[1]), argv[2]
    child._prctl(child.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:
        return 1
    try:
        child.private_mount_namespace(argv[3:])
    except OSError as exc:  # the host's namespace still works: only each create's cost grows with it
        print(f"zygote: no mount namespace of its own ({exc}); sandboxes copy the host's", file=sys.stderr)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"zygote: cannot preload {name}: {exc}", file=sys.stderr)
    entry = _load_entry(payload)
    import runpy  # noqa: F401  (used by children; imported here so they share it)

    if threading.active_count() > 1:
        # fork() copies only the calling thread: locks held by others stay locked in children.
        print(f"zygote: WARNING {threading.active_count()} threads after preloading", file=sys.stderr)
    sock = socket.socket(fileno=fd)
    gc.collect()
    gc.freeze()
    try:
        _Zygote(sock, entry).serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    except Exception:  # noqa: BLE001  (logged to the zygote log, then exit non-zero)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
