"""What a sandbox ran into: its limits as the host's kernel counts them, never as the sandbox says.

The memory cgroup counts OOM kills (v1 `memory.oom_control`, v2 `memory.events`: `oom_kill`), the
pids cgroup counts refused forks (`pids.events`: `max`), and the disk's filesystem says how full it
is. `check()` compares them with what was already reported and returns a notice per limit that was
hit since: the stream turns each new one into an `error` frame and a stored `error` event, and the
bridge adds them to the tool result the model reads (docs/protocol.md, `limits_check`).

Counters are events (reported once); a full disk is a state: it is `new` once when the disk
becomes full, and is listed again at every check while it stays full, so a model whose writes keep
failing is told why each time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ashd.sandboxing._cgroups import SandboxCgroup
from ashd.sandboxing._disk import MIB, DiskUsage, disk_usage, is_mounted
from ashd.sandboxing._types import SandboxLimits

MEMORY = "memory"
PIDS = "pids"
DISK = "disk"


@dataclass(frozen=True)
class LimitNotice:
    limit: str  # "memory", "pids" or "disk"
    message: str  # for a person (and the model): what happened and which limit
    new: bool = True  # False: a state reported before that still holds (a disk still full)

    def to_json(self) -> dict[str, str]:
        return {"limit": self.limit, "message": self.message}


def memory_message(limits: SandboxLimits, kills: int) -> str:
    what = "a process" if kills == 1 else f"{kills} processes"
    return (f"out of memory: the sandbox reached its memory limit of {limits.memory_bytes // MIB} MiB "
            f"and the kernel killed {what} in it")


def pids_message(limits: SandboxLimits, refused: int) -> str:
    times = "once" if refused == 1 else f"{refused} times"
    return (f"process limit reached: the sandbox may run at most {limits.pids} processes and threads; "
            f"starting another one failed {times}")


def disk_message(limits: SandboxLimits, usage: DiskUsage) -> str:
    size = limits.disk_bytes // MIB
    if usage.free_inodes == 0:
        return (f"disk quota reached: the sandbox's disk of {size} MiB (workspace, home and /tmp) has no "
                "room for another file (too many files); remove files to create new ones")
    return (f"disk quota reached: the sandbox's disk of {size} MiB (workspace, home and /tmp) is full "
            f"({usage.used_bytes // MIB} MiB used); remove files to write again")


class ResourceMeter:
    """One per sandbox; thread-safe. Reads a few small kernel files per check (microseconds)."""

    def __init__(self, cgroup: SandboxCgroup | None, disk: Path | None, limits: SandboxLimits) -> None:
        self._cgroup = cgroup
        self._disk = disk  # the mount point of the sandbox's disk image, None without a quota
        self.limits = limits
        self._lock = threading.Lock()
        self._oom = cgroup.oom_kills() if cgroup is not None else 0
        self._refused = cgroup.pids_limit_hits() if cgroup is not None else 0
        self._disk_full = False

    def check(self) -> list[LimitNotice]:
        with self._lock:
            notices: list[LimitNotice] = []
            if self._cgroup is not None:
                oom = self._cgroup.oom_kills()
                if oom > self._oom:
                    notices.append(LimitNotice(MEMORY, memory_message(self.limits, oom - self._oom)))
                self._oom = max(self._oom, oom)
                refused = self._cgroup.pids_limit_hits()
                if refused > self._refused:
                    notices.append(LimitNotice(PIDS, pids_message(self.limits, refused - self._refused)))
                self._refused = max(self._refused, refused)
            usage = self.disk_usage()
            full = usage is not None and usage.full
            if usage is not None and full:
                notices.append(LimitNotice(DISK, disk_message(self.limits, usage), new=not self._disk_full))
            self._disk_full = full
            return notices

    def cpu_seconds(self) -> float | None:
        """The sandbox's CPU time so far, from the kernel's cgroup accounting; None without it."""
        return self._cgroup.cpu_seconds() if self._cgroup is not None else None

    def disk_usage(self) -> DiskUsage | None:
        if self._disk is None or not is_mounted(self._disk):
            return None
        return disk_usage(self._disk)
