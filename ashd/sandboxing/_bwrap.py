"""The bubblewrap command line for one sandbox.

bwrap runs as root (Debian's bwrap 0.8 is not setuid) and builds the namespaces and mounts; the
payload then drops to the unprivileged host uid through `setpriv` inside the sandbox. Running bwrap
itself as uid 65534 also works on this kernel (it creates a user namespace), but only when every
bind source is traversable by that uid, which a 0700 data dir is not: see docs in the report.

The process tree is: bwrap (host side, the pid we hold) -> bwrap pid 1 (reaper) -> setpriv ->
payload. A `sh` wrapper joins the cgroups before exec, so nothing ever runs outside them.

Every sandbox gets a network namespace that is not the host's: a fresh, empty one
(`--unshare-net`), or, when it opted into network, the one the launcher prepared for it
(`_netns.py`), which bwrap cannot join by itself, so `nsenter --net=<path>` execs it there.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from ashd.sandboxing._layout import HOSTNAME, SANDBOX_GID, SANDBOX_UID, Mount
from ashd.sandboxing._types import SANDBOX_WORKSPACE

BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
NSENTER = "/usr/bin/nsenter"


def drop_privileges_argv(argv: Sequence[str]) -> list[str]:
    return [
        SETPRIV,
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_GID}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]


def bwrap_argv(
    plan: Sequence[Mount],
    env: Mapping[str, str],
    argv: Sequence[str],
    *,
    netns: str | None,
    bwrap: str = BWRAP,
) -> list[str]:
    """`netns`: the path of a prepared network namespace to run in; None for a new, empty one."""
    cmd = [
        bwrap,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        HOSTNAME,
        "--clearenv",
    ]
    if netns is None:
        cmd.append("--unshare-net")
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    for m in plan:
        if m.kind == "dir":
            cmd += ["--perms", "0755", "--dir", m.dest]
        elif m.kind == "symlink":
            cmd += ["--symlink", m.src, m.dest]
        elif m.kind in ("ro-bind", "bind"):
            cmd += [f"--{m.kind}", m.src, m.dest]
        elif m.kind == "tmpfs":
            # A tmpfs is the sandbox's private /tmp: sticky and world-writable, as on a host.
            cmd += ["--perms", "01777", "--tmpfs", m.dest]
        elif m.kind in ("proc", "dev"):
            cmd += [f"--{m.kind}", m.dest]
        else:
            raise ValueError(f"unknown mount kind {m.kind!r}")
    cmd += ["--remount-ro", "/", "--chdir", SANDBOX_WORKSPACE, "--"]
    cmd += drop_privileges_argv(argv)
    if netns is not None:
        cmd = [NSENTER, f"--net={netns}", "--", *cmd]
    return cmd


def cgroup_wrapper(procs_files: Sequence[Path], argv: Sequence[str]) -> list[str]:
    """`sh` joins every cgroup with its own pid, then execs: race-free, no preexec_fn in a threaded
    server."""
    joins = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in procs_files)
    return ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *argv]
