"""Sandbox lifecycle: isolation (bwrap or a zygote), cgroup limits, the shutdown ladder."""

from ashd.sandboxing._cgroups import CgroupTree, SandboxCgroup, detect_version
from ashd.sandboxing._isolation import isolation_problems, probe_isolation
from ashd.sandboxing._launcher import LauncherConfig, SandboxLauncher
from ashd.sandboxing._process import SandboxProcess
from ashd.sandboxing._reaper import reap_leftovers
from ashd.sandboxing._types import (
    BRIDGE_SOCKET,
    MODEL_SOCKET,
    SANDBOX_HOME,
    SANDBOX_RUN,
    SANDBOX_WORKSPACE,
    ExitInfo,
    ExitReason,
    IsolationReport,
    SandboxLimits,
    SandboxPaths,
    SandboxSpec,
    ShutdownRung,
)

__all__ = [
    "BRIDGE_SOCKET",
    "MODEL_SOCKET",
    "SANDBOX_HOME",
    "SANDBOX_RUN",
    "SANDBOX_WORKSPACE",
    "CgroupTree",
    "ExitInfo",
    "ExitReason",
    "IsolationReport",
    "LauncherConfig",
    "SandboxCgroup",
    "SandboxLauncher",
    "SandboxLimits",
    "SandboxPaths",
    "SandboxProcess",
    "SandboxSpec",
    "ShutdownRung",
    "detect_version",
    "isolation_problems",
    "probe_isolation",
    "reap_leftovers",
]
