"""Value types shared by the sandbox layer, the pool and the session actors.

A sandbox lives in `<data dir>/sandboxes/<sandbox id>/` on the host:

    disk.img        the sandbox's disk: a sparse ext4 image as big as its quota (host only)
    disk/           where that image is mounted; everything the sandbox can write is in it:
      workspace/    mounted read-write at /workspace   (the agent's files)
      home/         mounted read-write at /home/agent  (HOME of the sandbox user)
      tmp/          mounted read-write at /tmp
      run/          mounted read-write at /run/ashd    (bridge.sock: the bridge listens here;
                                                        model.sock: the server's model proxy)
      logs/         host only: sandbox stdout/stderr (inside the image, so it counts too)

Without a disk quota (SERVICE_SANDBOX_DISK_MB=0, or weak isolation) `disk/` is a plain directory
with the same layout. Nothing else of the data dir is visible inside.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_HOME = "/home/agent"
SANDBOX_RUN = "/run/ashd"
BRIDGE_SOCKET = "bridge.sock"
MODEL_SOCKET = "model.sock"


@dataclass(frozen=True)
class SandboxLimits:
    memory_bytes: int = 512 * 1024 * 1024
    pids: int = 256
    cpu_cores: float = 1.0
    # Size of the sandbox's disk (workspace, HOME, /tmp); 0: no quota, plain directories.
    disk_bytes: int = 1024 * 1024 * 1024


@dataclass(frozen=True)
class SandboxPaths:
    root: Path

    @property
    def image(self) -> Path:
        return self.root / "disk.img"

    @property
    def disk(self) -> Path:
        return self.root / "disk"

    @property
    def workspace(self) -> Path:
        return self.disk / "workspace"

    @property
    def home(self) -> Path:
        return self.disk / "home"

    @property
    def tmp(self) -> Path:
        return self.disk / "tmp"

    @property
    def run(self) -> Path:
        return self.disk / "run"

    @property
    def logs(self) -> Path:
        return self.disk / "logs"

    @property
    def bridge_socket(self) -> Path:
        return self.run / BRIDGE_SOCKET

    @property
    def model_socket(self) -> Path:
        return self.run / MODEL_SOCKET


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to launch one sandbox. `env` is final: already allowlisted and merged."""

    sandbox_id: str
    paths: SandboxPaths
    env: Mapping[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: bool = False
    # None: the bridge (`python -m ashd.bridge`). Tests pass other programs (fault doubles).
    argv: tuple[str, ...] | None = None
    # The seccomp profile (`_seccomp_profile.PROFILES`): "default", or what the operator chose
    # for this agent.
    seccomp: str = "default"


class ShutdownRung(enum.Enum):
    """How far the shutdown ladder had to go."""

    ALREADY_EXITED = "already_exited"
    PROTOCOL = "protocol"  # exited after the bridge's `shutdown` command
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"


class ExitReason(enum.Enum):
    NORMAL = "normal"  # exit code 0
    ERROR = "error"  # non-zero exit code
    SIGNALLED = "signalled"  # killed by a signal other than an OOM kill
    OUT_OF_MEMORY = "out_of_memory"  # the cgroup's oom_kill counter moved


@dataclass(frozen=True)
class ExitInfo:
    returncode: int
    reason: ExitReason
    memory_limit_bytes: int = 0

    def describe(self) -> str:
        if self.reason is ExitReason.OUT_OF_MEMORY:
            limit = f" of {self.memory_limit_bytes // (1024 * 1024)} MiB" if self.memory_limit_bytes else ""
            return f"out of memory: the sandbox exceeded its memory limit{limit} and was killed"
        if self.reason is ExitReason.SIGNALLED:
            return f"sandbox killed by signal {-self.returncode}"
        if self.reason is ExitReason.ERROR:
            return f"sandbox exited with code {self.returncode}"
        return "sandbox exited"


@dataclass(frozen=True)
class IsolationReport:
    """What this host can do, shown at start and in /health."""

    bwrap: bool
    cgroups: str  # "v2", "v1" or "none"
    user_namespaces: bool
    weak: bool  # True when sandboxes run without full isolation (explicitly allowed)
    detail: str = ""
    network: str = ""  # what a sandbox that opts into network gets, or why it cannot start
    # The seccomp profile every sandbox gets unless the operator loosened it for an agent;
    # "none" when sandboxes run without a filter (weak isolation).
    seccomp: str = "none"
    # Whether a process inside a sandbox can create a user namespace (never, when isolated).
    sandbox_user_namespaces: bool = True
    disk_quota: bool = False  # sandbox disks are loop-mounted images of a fixed size
