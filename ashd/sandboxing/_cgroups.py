"""Per-sandbox cgroups on cgroup v2 and v1 hosts (memory, pids, cpu).

Sandbox cgroups live under the service's OWN cgroup (read from /proc/self/cgroup), so any limit put
on the service still bounds its sandboxes:

    <own>/ashd/<data dir key>/<sandbox id>

The data dir key keeps two services (or two test launchers) on one host from reaping each other.
Every path is derived from `mount_root` and the text of /proc/self/cgroup, so the file-writing logic
can be unit-tested against a fake tree in a temporary directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ashd.sandboxing._types import SandboxLimits

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("memory", "pids", "cpu")
# CPU time accounting (usage per turn): its own hierarchy, or co-mounted with cpu ("cpu,cpuacct").
# Optional: a host without it still runs sandboxes, and usage falls back to wall time.
V1_OPTIONAL = ("cpuacct",)
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
# On v2 a cgroup that delegates controllers may not hold processes, so the service moves itself here.
V2_SERVICE_LEAF = "ashd-server"


def data_dir_key(data_dir: Path) -> str:
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each v1 controller (and "" for the v2 unified line) to the process's cgroup path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


def detect_version(mount_root: Path = Path("/sys/fs/cgroup")) -> str:
    """ "v2" (pure unified hierarchy), "v1" (memory, pids and cpu hierarchies) or "none"."""
    if (mount_root / "cgroup.controllers").exists():
        available = (mount_root / "cgroup.controllers").read_text().split()
        return "v2" if all(c in available for c in V2_CONTROLLERS) else "none"
    if all((mount_root / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return "v1"
    return "none"


def _write(path: Path, value: str) -> None:
    """One write: three system calls, where `open(path, "w")` makes seven (a text file's fstat,
    isatty and seeks); five of these per sandbox start. The same flags as `open(path, "w")`."""
    data = value.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        if os.write(fd, data) != len(data):  # the kernel takes a control file's value whole, or fails
            raise OSError(errno.EIO, f"short write to {path}")
    finally:
        os.close(fd)


def _read_int_field(path: Path, key: str) -> int:
    """A `key value` file's value of `key` (0 when absent or unreadable). Read at each turn's end and
    after each tool call, as `cpu_seconds` is: one open and read, without pathlib's layers."""
    for line in (_read_small(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _read_small(path: Path) -> str | None:
    """A small kernel file's text (one read), or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass(frozen=True)
class SandboxCgroup:
    """One sandbox's cgroup directories (one per v1 controller, one on v2)."""

    version: str
    dirs: dict[str, Path]  # controller name (or "unified") -> directory

    @property
    def join_files(self) -> list[Path]:
        """Where a process writes "0" to join its sandbox's cgroup: v1's `tasks`, v2's cgroup.procs.

        Every joiner is single-threaded (a fresh fork, `sh`), so on v1 moving its own thread moves
        the process, and a write of "0" to `tasks` is the one move that skips the kernel's global
        threadgroup lock, whose write side waits out an RCU grace period: 0.4 ms per hierarchy
        instead of 6 ms (p50, up to 20). v2 refuses a thread move between domains; there the
        zygote's children are born in their cgroup instead (CLONE_INTO_CGROUP) where it can.
        """
        name = "cgroup.procs" if self.version == "v2" else "tasks"
        return [d / name for d in self.dirs.values()]

    def _dir(self, controller: str) -> Path:
        return self.dirs["unified"] if self.version == "v2" else self.dirs[controller]

    def pids(self) -> list[int]:
        return _read_pids(self._dir("pids") / "cgroup.procs")

    def oom_kills(self) -> int:
        if self.version == "v2":
            return _read_int_field(self._dir("memory") / "memory.events", "oom_kill")
        return _read_int_field(self._dir("memory") / "memory.oom_control", "oom_kill")

    def pids_limit_hits(self) -> int:
        """How many forks (or thread creations) failed because the sandbox reached pids.max."""
        return _read_int_field(self._dir("pids") / "pids.events", "max")

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) used by every process the sandbox ever ran; None if not accounted.
        Read at each turn's start and end, on the session's thread: one open and read of the file
        (10 us), not pathlib's checks and reads around it (42 us, measured)."""
        if self.version == "v2":
            text = _read_small(self.dirs["unified"] / "cpu.stat")
            for line in (text or "").splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
            return None
        for controller in ("cpuacct", "cpu"):  # co-mounted: cpuacct.usage sits in the cpu dir
            d = self.dirs.get(controller)
            text = _read_small(d / "cpuacct.usage") if d is not None else None
            if text is not None:
                with contextlib.suppress(ValueError):
                    return int(text) / 1e9
        return None

    def memory_bytes(self) -> int:
        name = "memory.current" if self.version == "v2" else "memory.usage_in_bytes"
        try:
            return int((self._dir("memory") / name).read_text().strip())
        except (OSError, ValueError):
            return 0

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup, including ones forked while we kill."""
        if self.version == "v2" and (self.dirs["unified"] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs["unified"] / "cgroup.kill", "1")
                return
        # v1 has no cgroup.kill: loop until no pid is left. A fork bomb cannot outrun this for long
        # because pids.max bounds it and every round kills all that are listed.
        for _ in range(1000):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def charged(self) -> int:
        """Tasks the pids controller still counts: alive, exiting or zombie. cgroup.procs drops a
        task as soon as it starts exiting, and rmdir then succeeds, while the task may still be
        tearing down (a pid namespace's init waits there for its children) or sit, a zombie,
        until its parent reaps it; this count reaches 0 only once every task has been reaped."""
        try:
            return int((self._dir("pids") / "pids.current").read_text())
        except (OSError, ValueError):
            return 0

    def kill_and_remove(self, timeout: float, reap: Callable[[], object] = lambda: None) -> bool:
        """SIGKILL what is left, wait until every task is reaped, then rmdir; True when all of it
        happened within `timeout`. `reap` runs on each round, for a child only the caller reaps.
        Past `timeout` the directories are still removed if the kernel lets us (it does once the
        tasks left are all exiting), so cgroups do not pile up behind a host that never reaps."""
        pause = threading.Event()
        deadline = time.monotonic() + timeout
        while True:
            self.kill_all()
            reap()
            left = self.charged()
            if left == 0 and self.remove():
                return True
            if time.monotonic() >= deadline:
                removed = self.remove()
                log.error("sandbox cgroup %s: %d tasks still not reaped after %.0f s; cgroup %s", self.dirs,
                          left, timeout, "removed" if removed else "left for the next start's sweep")
                return False
            pause.wait(0.005)

    def remove(self) -> bool:
        """rmdir every directory; True when all are gone. Needs the processes dead and reaped."""
        gone = True
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                    gone = False
                else:
                    raise
        return gone


class CgroupTree:
    """The service's branch of the cgroup hierarchy: creates, lists and removes sandbox cgroups."""

    def __init__(
        self,
        data_dir: Path,
        *,
        mount_root: Path = Path("/sys/fs/cgroup"),
        proc_self_cgroup: str | None = None,
    ) -> None:
        self.mount_root = mount_root
        self.version = detect_version(mount_root)
        if proc_self_cgroup is None:
            proc_self_cgroup = Path("/proc/self/cgroup").read_text()
        self._own = parse_proc_cgroup(proc_self_cgroup)
        self.key = data_dir_key(data_dir)

    # -- layout --------------------------------------------------------------------------------

    def _own_dir(self, controller: str) -> Path:
        if self.version == "v2":
            own = self._own.get("", "/")
            # After a restart we already live in our leaf: the delegating cgroup is its parent.
            if own.rstrip("/").endswith("/" + V2_SERVICE_LEAF):
                own = own.rstrip("/")[: -len(V2_SERVICE_LEAF) - 1] or "/"
            return self.mount_root / own.lstrip("/")
        return self.mount_root / controller / self._own.get(controller, "/").lstrip("/")

    def parent_dirs(self) -> dict[str, Path]:
        """Our `<own>/ashd/<key>` per controller (a single "unified" entry on v2)."""
        if self.version == "v2":
            return {"unified": self._own_dir("") / "ashd" / self.key}
        present = [c for c in V1_OPTIONAL if (self.mount_root / c / "cgroup.procs").exists()]
        return {c: self._own_dir(c) / "ashd" / self.key for c in (*V1_CONTROLLERS, *present)}

    # -- parent set-up ---------------------------------------------------------------------------

    def setup(self) -> None:
        if self.version == "v2":
            self._setup_v2()
        else:
            for d in self.parent_dirs().values():
                d.mkdir(parents=True, exist_ok=True)

    def _setup_v2(self) -> None:
        own = self._own_dir("")
        enable = " ".join("+" + c for c in V2_CONTROLLERS)
        # The no-internal-process rule does not apply to the root cgroup.
        if own != self.mount_root:
            pids = _read_pids(own / "cgroup.procs")
            if pids:
                leaf = own / V2_SERVICE_LEAF
                leaf.mkdir(exist_ok=True)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, OSError):
                        _write(leaf / "cgroup.procs", str(pid))
        _write(own / "cgroup.subtree_control", enable)
        ashd = own / "ashd"
        ashd.mkdir(exist_ok=True)
        _write(ashd / "cgroup.subtree_control", enable)
        parent = ashd / self.key
        parent.mkdir(exist_ok=True)
        _write(parent / "cgroup.subtree_control", enable)

    # -- sandboxes -------------------------------------------------------------------------------

    def create(self, sandbox_id: str, limits: SandboxLimits) -> SandboxCgroup:
        dirs = {name: parent / sandbox_id for name, parent in self.parent_dirs().items()}
        attempts = 10
        for attempt in range(attempts):
            try:
                for d in dirs.values():
                    d.mkdir(exist_ok=True)
                break
            except FileNotFoundError:
                # Our empty parent was swept by another service's start-up (sweep_empty_parents): a
                # host starting many services at once can sweep it again between our set-up and the
                # mkdir, so a few attempts (each a few microseconds) before giving up.
                if attempt == attempts - 1:
                    raise
                self.setup()
        quota = max(1000, int(limits.cpu_cores * CPU_PERIOD_US))
        if self.version == "v2":
            d = dirs["unified"]
            _write(d / "memory.max", str(limits.memory_bytes))
            # Swap would let a sandbox go far past its memory limit without an OOM kill.
            with contextlib.suppress(OSError):
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(limits.pids))
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
            memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                _write(memsw, str(limits.memory_bytes))
            _write(dirs["pids"] / "pids.max", str(limits.pids))
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
        return SandboxCgroup(self.version, dirs)

    def existing(self) -> list[SandboxCgroup]:
        """Sandbox cgroups left under our parent (e.g. by a server that was killed)."""
        names: set[str] = set()
        for parent in self.parent_dirs().values():
            # Gone meanwhile: another service's start-up swept it, empty (`sweep_empty_parents`).
            with contextlib.suppress(FileNotFoundError):
                names.update(p.name for p in parent.iterdir() if p.is_dir())
        return [
            SandboxCgroup(self.version, {c: p / n for c, p in self.parent_dirs().items()})
            for n in sorted(names)
        ]

    def sweep_empty_parents(self) -> int:
        """rmdir every *empty* `<own>/ashd/<key>` (a killed server's, whatever its data dir).
        rmdir refuses non-empty cgroups, so live services keep theirs; `create` recreates a
        parent swept under its feet."""
        removed = 0
        for parent in self.parent_dirs().values():
            ashd = parent.parent
            if not ashd.is_dir():
                continue
            for other in ashd.iterdir():
                if other.is_dir() and other != parent:
                    try:
                        other.rmdir()
                        removed += 1
                    except OSError:
                        pass
        return removed

    def teardown(self) -> None:
        """Remove our `<own>/ashd/<key>` (and `ashd` when no other service uses it)."""
        for parent in self.parent_dirs().values():
            for d in (parent, parent.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()
