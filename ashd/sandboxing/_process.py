"""One running sandbox: poll, wait, signal, the shutdown ladder, cleanup, memory figures.

The pid we hold is the sandbox's host-side process: on the bwrap route its *monitor* (bwrap's
outer process; below it, after a second, unprivileged bwrap, runs the sandbox's pid 1), on the
zygote route the sandbox's pid 1 itself (the zygote's child). The payload runs below that pid 1,
a reaper, except the bridge on the zygote route, which is its sandbox's pid 1 (`init_is_payload`).
Signals go only to the payload: the processes of the sandbox's pid namespace other than a reaping
pid 1, so a payload that ignores SIGTERM really survives SIGTERM (a monitor would otherwise die of
it and take the payload along).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil

from ashd.sandboxing._cgroups import SandboxCgroup
from ashd.sandboxing._meter import ResourceMeter
from ashd.sandboxing._types import ExitInfo, ExitReason, SandboxLimits, SandboxPaths, ShutdownRung

log = logging.getLogger(__name__)

# How long a kill waits for the held process, and cleanup for every killed process to be reaped.
CLEANUP_TIMEOUT = 10.0


class ChildHandle(Protocol):
    """The host-side process, as its parent sees it. Returncodes are Popen-style (-N = signal N)."""

    pid: int

    def poll_status(self) -> int | None: ...

    def wait_status(self, timeout: float | None) -> int | None: ...


class PopenChild:
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    def poll_status(self) -> int | None:
        return self._popen.poll()

    def wait_status(self, timeout: float | None) -> int | None:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def _ns_pids(pid: int) -> list[str]:
    """The process's pid at each pid namespace level, the host's first (empty once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return line.split()[1:]
    except OSError:
        pass
    return []


def _is_payload(pid: int) -> bool:
    """In a pid namespace below the host's and not its pid 1."""
    levels = _ns_pids(pid)
    return len(levels) > 1 and levels[-1] != "1"


def _is_sandbox_init(pid: int) -> bool:
    """The pid 1 of a pid namespace below the host's."""
    levels = _ns_pids(pid)
    return len(levels) > 1 and levels[-1] == "1"


class SandboxProcess:
    def __init__(
        self,
        sandbox_id: str,
        child: ChildHandle,
        *,
        paths: SandboxPaths,
        cgroup: SandboxCgroup | None,
        isolated: bool,
        init_is_payload: bool = False,
        oom_kills_before: int = 0,
        on_cleanup: Callable[[SandboxProcess], None] | None = None,
        limits: SandboxLimits | None = None,
        disk_quota: bool = False,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.pid = child.pid
        self.paths = paths
        self.cgroup = cgroup
        # Isolated: the held pid reports a payload's death by signal N as 128+N, as bwrap does.
        self.isolated = isolated
        # The payload is the pid 1 of its namespace: signals meant for the payload go to it too.
        self.init_is_payload = init_is_payload
        self._child = child
        self._oom_before = oom_kills_before
        self._on_cleanup = on_cleanup
        self.limits = limits or SandboxLimits()
        # What the sandbox ran into (OOM kills, refused forks, a full disk), read from the host side.
        self.meter = ResourceMeter(cgroup, paths.disk if disk_quota else None, self.limits)
        self._exit: ExitInfo | None = None
        self._lock = threading.Lock()
        self._cleaned = False

    # -- exit status -----------------------------------------------------------------------------

    def _exit_info(self, rc: int) -> ExitInfo:
        with self._lock:
            if self._exit is None:
                if self.isolated and 128 < rc < 128 + 65:
                    rc = -(rc - 128)
                oom = self.cgroup is not None and self.cgroup.oom_kills() > self._oom_before
                if oom and rc != 0:
                    reason = ExitReason.OUT_OF_MEMORY
                elif rc == 0:
                    reason = ExitReason.NORMAL
                elif rc < 0:
                    reason = ExitReason.SIGNALLED
                else:
                    reason = ExitReason.ERROR
                self._exit = ExitInfo(rc, reason, self.limits.memory_bytes)
            return self._exit

    def poll(self) -> ExitInfo | None:
        rc = self._child.poll_status()
        return None if rc is None else self._exit_info(rc)

    def wait(self, timeout: float | None = None) -> ExitInfo:
        rc = self._child.wait_status(timeout)
        if rc is None:
            raise TimeoutError(f"sandbox {self.sandbox_id} still running after {timeout} s")
        return self._exit_info(rc)

    # -- signals ---------------------------------------------------------------------------------

    def sandbox_pids(self) -> list[int]:
        """Every process of the sandbox, the held one and the reaper included."""
        if self.cgroup is not None:
            return self.cgroup.pids()
        try:
            proc = psutil.Process(self.pid)
            return [self.pid] + [c.pid for c in proc.children(recursive=True)]
        except psutil.Error:
            return []

    def _payload_pids(self) -> list[int]:
        pids = self.sandbox_pids()
        if not self.isolated:
            return pids
        return [p for p in pids if _is_payload(p) or (self.init_is_payload and _is_sandbox_init(p))]

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if not self.isolated and self.cgroup is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            return
        for pid in self._payload_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole sandbox, the held process included.

        The sandbox's pid 1 goes first, alone: the kernel kills the rest of its pid namespace,
        that pid 1 reaps them, and its parent (bwrap's monitor, or the zygote) reaps it, so once
        the held process's exit is seen the namespace is empty. Killing bwrap's monitor in the
        same sweep would orphan the pid 1 to the host's init, which reaps it when it gets round to
        it (seconds on some hosts), and the sandbox's processes would outlive its cleanup.
        Everything left (a sandbox with no pid 1 yet, a monitor that does not exit) is then killed
        at once."""
        if self._kill_namespace() and self._child.wait_status(CLEANUP_TIMEOUT) is not None:
            return
        if self.cgroup is not None:
            self.cgroup.kill_all()
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def _kill_namespace(self) -> bool:
        """SIGKILL the sandbox's pid 1 while the held process runs; False when there is none to kill."""
        if not self.isolated or self.cgroup is None or self.poll() is not None:
            return False
        killed = False
        for pid in self.cgroup.pids():
            if _is_sandbox_init(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed = True
        return killed

    def shutdown(self, request_exit: Callable[[], None] | None, grace: float = 2.0) -> ShutdownRung:
        """Protocol request -> wait -> SIGTERM -> wait -> SIGKILL; returns the rung that ended it."""
        if self.poll() is not None:
            return ShutdownRung.ALREADY_EXITED
        if request_exit is not None:
            try:
                request_exit()
            except Exception as exc:  # noqa: BLE001  (a dead bridge socket must not stop the ladder)
                log.info("sandbox %s: shutdown request failed: %s", self.sandbox_id, exc)
            if self._child.wait_status(grace) is not None:
                return ShutdownRung.PROTOCOL
        self.terminate()
        if self._child.wait_status(grace) is not None:
            return ShutdownRung.SIGTERM
        self.kill()
        if self._child.wait_status(CLEANUP_TIMEOUT) is None:
            log.error("sandbox %s: pid %d survived SIGKILL", self.sandbox_id, self.pid)
        return ShutdownRung.SIGKILL

    # -- resources -------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        return self.cgroup.memory_bytes() if self.cgroup is not None else 0

    def pss_bytes(self) -> int:
        total = 0
        for pid in self.sandbox_pids():
            with contextlib.suppress(psutil.Error, AttributeError):
                total += psutil.Process(pid).memory_full_info().pss
        return total

    # -- cleanup ---------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Kill what is left, remove the cgroup and the sockets. Idempotent."""
        with self._lock:
            if self._cleaned:
                return
        if self._child.poll_status() is None:
            self.kill()
            self._child.wait_status(CLEANUP_TIMEOUT)
        if self.cgroup is not None:
            # Whatever escaped the pid 1's reaping goes too, and is reaped, before the rmdir.
            self.cgroup.kill_and_remove(CLEANUP_TIMEOUT, reap=self._child.poll_status)
        with contextlib.suppress(FileNotFoundError):
            for sock in self.paths.run.glob("*.sock"):
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()
        with self._lock:
            self._cleaned = True
        if self._on_cleanup is not None:
            self._on_cleanup(self)
