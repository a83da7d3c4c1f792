"""What this host can do to isolate sandboxes, probed once at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ashd.sandboxing import _seccomp
from ashd.sandboxing._bwrap import BWRAP, SETPRIV, drop_privileges_argv
from ashd.sandboxing._cgroups import detect_version
from ashd.sandboxing._types import IsolationReport


def _user_namespaces() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


def unprivileged_bwrap_works(bwrap: str = BWRAP) -> bool:
    """Stage 2 of the bwrap route in miniature: the sandbox uid makes a user namespace and locks
    it. Fails where unprivileged user namespaces are off (user.max_user_namespaces=0, Debian's
    kernel.unprivileged_userns_clone=0, an AppArmor restriction)."""
    cmd = drop_privileges_argv([bwrap, "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "/bin/true"])
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env={}).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def isolation_problems(
    *, bwrap: str = BWRAP, cgroup_root: Path = Path("/sys/fs/cgroup"), bwrap_route: bool = True
) -> list[str]:
    """Why this host cannot fully isolate sandboxes; empty when it can. Full isolation needs Linux,
    root (to build namespaces and switch to the sandbox uid), bwrap, setpriv, libseccomp and
    cgroups with memory, pids and cpu; the bwrap route also needs unprivileged user namespaces."""
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
    try:
        _seccomp.check_available()
    except _seccomp.SeccompUnavailable as exc:
        problems.append(str(exc))
    if bwrap_route and not problems and not unprivileged_bwrap_works(bwrap):
        problems.append(
            "bubblewrap cannot create a user namespace as the sandbox uid (unprivileged user namespaces are "
            "off: sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone or an AppArmor "
            "restriction); enable them, or launch through the zygote (SERVICE_ZYGOTE=1)"
        )
    return problems


def probe_isolation(
    *,
    bwrap: str = BWRAP,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    allow_weak: bool = False,
    bwrap_route: bool = True,
) -> IsolationReport:
    """`weak` is True only when something is missing and weak isolation is allowed."""
    problems = isolation_problems(bwrap=bwrap, cgroup_root=cgroup_root, bwrap_route=bwrap_route)
    linux = sys.platform.startswith("linux")
    cgroups = detect_version(cgroup_root) if linux else "none"
    weak = bool(problems) and allow_weak
    return IsolationReport(
        bwrap=linux and os.access(bwrap, os.X_OK),
        cgroups=cgroups,
        user_namespaces=linux and _user_namespaces(),
        weak=weak,
        detail="; ".join(problems) if problems else f"bwrap and cgroup {cgroups} limits, seccomp filter",
        seccomp="none" if weak or problems else "default",
        sandbox_user_namespaces=weak or bool(problems),
    )
