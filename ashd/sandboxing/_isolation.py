"""What this host can do to isolate sandboxes, probed once at start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ashd.sandboxing._bwrap import BWRAP, SETPRIV
from ashd.sandboxing._cgroups import detect_version
from ashd.sandboxing._types import IsolationReport


def _user_namespaces() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


def isolation_problems(*, bwrap: str = BWRAP, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Why this host cannot fully isolate sandboxes; empty when it can. Full isolation needs Linux,
    root (to build namespaces and switch to the sandbox uid), bwrap, setpriv and cgroups with
    memory, pids and cpu."""
    if not sys.platform.startswith("linux"):
        return [f"not Linux ({sys.platform})"]
    problems: list[str] = []
    if not os.access(bwrap, os.X_OK):
        problems.append(f"bubblewrap not found at {bwrap} (apt-get install bubblewrap)")
    if not os.access(SETPRIV, os.X_OK):
        problems.append(f"setpriv not found at {SETPRIV} (apt-get install util-linux)")
    if detect_version(cgroup_root) == "none":
        problems.append(f"no cgroup v2 or v1 hierarchy with memory, pids and cpu under {cgroup_root}")
    if os.geteuid() != 0:
        problems.append("the server is not root, so it cannot create namespaces or switch the sandbox uid")
    return problems


def probe_isolation(
    *, bwrap: str = BWRAP, cgroup_root: Path = Path("/sys/fs/cgroup"), allow_weak: bool = False
) -> IsolationReport:
    """`weak` is True only when something is missing and weak isolation is allowed."""
    problems = isolation_problems(bwrap=bwrap, cgroup_root=cgroup_root)
    linux = sys.platform.startswith("linux")
    cgroups = detect_version(cgroup_root) if linux else "none"
    return IsolationReport(
        bwrap=linux and os.access(bwrap, os.X_OK),
        cgroups=cgroups,
        user_namespaces=linux and _user_namespaces(),
        weak=bool(problems) and allow_weak,
        detail="; ".join(problems) if problems else f"bwrap and cgroup {cgroups} limits",
    )
