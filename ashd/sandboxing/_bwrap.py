"""The bubblewrap command line for one sandbox: two bwraps, so that nothing inside runs as root.

Debian's bwrap 0.8 is not setuid, and it has no `--bind-fd`: whatever it binds it must reach by
path with its own uid. The bind sources (the Python prefix under /root, a 0700 data dir) are
not reachable by the sandbox uid, and a bwrap run as root without a user namespace keeps its pid 1
as uid 0 for the sandbox's whole life; with `--unshare-user` it would map the sandbox uid to root
outside. So the launch has two stages (docs/sandboxes.md has the reasoning):

1. **outer**, as root, no user namespace: builds the mount plan (every source is reachable as
   root; parents are made 0755, so the sandbox uid can walk every path), plus the ipc, uts,
   cgroup and network namespaces. It forks no init: its child, a `sh` that stays root on the
   host side, starts stage 2 through `setpriv` (uid/gid 65534, no groups, no capabilities, empty
   bounding set, no_new_privs) and waits for it.
2. **inner**, as uid 65534: an ordinary unprivileged bwrap. It makes its own user namespace
   (65534 inside is 65534 outside), `--disable-userns` caps it so the sandbox can create no other,
   then the pid namespace, a fresh tmpfs root with the same plan bound from stage 1's view,
   its own /proc, /dev and /tmp, and `--seccomp FD`, which bwrap applies to its pid 1 and to
   the payload.

Host tree: bwrap (root, the pid we hold) -> sh (root, host pid ns) -> bwrap (65534, host pid ns)
-> bwrap init (pid 1, 65534) -> payload (pid 2). A `sh` wrapper joins the cgroups before the
first exec.

Why the `sh` in between: every process here dies with its parent (PR_SET_PDEATHSIG), and the
kernel delivers that signal only if the dying parent may signal the child. Stage 1's monitor is
root without capabilities (bwrap drops them), so it may not signal a uid-65534 child: stage 2 would
outlive a killed server. The `sh` is uid 0 like stage 1's monitor (so it dies with it) and keeps
CAP_KILL (so stage 2 dies with it).

Every sandbox gets a network namespace that is not the host's: a fresh, empty one
(`--unshare-net` in stage 1), or, when it opted into network, the one the launcher prepared for it
(`_netns.py`), which bwrap cannot join by itself, so `nsenter --net=<path>` execs stage 1 there.
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


def _mount_args(m: Mount, *, outer: bool) -> list[str]:
    if m.kind == "dir":
        return ["--perms", "0755", "--dir", m.dest]
    if m.kind == "symlink":
        return ["--symlink", m.src, m.dest]
    if m.kind in ("ro-bind", "bind"):
        # Stage 1 put every source at its destination; stage 2 binds it from there.
        return [f"--{m.kind}", m.src if outer else m.dest, m.dest]
    if m.kind == "tmpfs":
        # A tmpfs is the sandbox's private /tmp: sticky and world-writable, as on a host. Stage 1
        # needs the directory only: stage 2 mounts its own root's tmpfs on /tmp while it sets up.
        return ["--perms", "0755", "--dir", m.dest] if outer else ["--perms", "01777", "--tmpfs", m.dest]
    if m.kind == "proc":
        # An unprivileged bwrap may mount a new proc only where a fully visible one exists in its
        # mount namespace; stage 1's own --proc would hide /proc/sys and friends under read-only
        # binds and make stage 2's mount fail, so stage 1 passes the host's through. The payload
        # never sees it: stage 2 builds a fresh root and mounts its own pid namespace's proc.
        return ["--bind", "/proc", m.dest] if outer else ["--proc", m.dest]
    if m.kind == "dev":
        return ["--dev", m.dest]
    raise ValueError(f"unknown mount kind {m.kind!r}")


def inner_argv(
    plan: Sequence[Mount],
    env: Mapping[str, str],
    argv: Sequence[str],
    *,
    seccomp_fd: int | None,
    bwrap: str = BWRAP,
) -> list[str]:
    """Stage 2, run as the sandbox uid inside stage 1's view."""
    cmd = [
        bwrap,
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--unshare-pid",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    for m in plan:
        cmd += _mount_args(m, outer=False)
    cmd += ["--remount-ro", "/", "--chdir", SANDBOX_WORKSPACE, "--", *argv]
    return cmd


def bwrap_argv(
    plan: Sequence[Mount],
    env: Mapping[str, str],
    argv: Sequence[str],
    *,
    netns: str | None,
    seccomp_fd: int | None = None,
    bwrap: str = BWRAP,
) -> list[str]:
    """Stage 1 (root) wrapping stage 2 (the sandbox uid); `seccomp_fd` must be inherited.

    `netns`: the path of a prepared network namespace to run in; None for a new, empty one."""
    cmd = [
        bwrap,
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
    for m in plan:
        cmd += _mount_args(m, outer=True)
    cmd += ["--remount-ro", "/", "--chdir", "/", "--"]
    inner = inner_argv(plan, env, argv, seccomp_fd=seccomp_fd, bwrap=bwrap)
    # Not `exec`: the root `sh` must stay as stage 2's parent (see the module doc). Exit status
    # passes through: 128+N for death by signal N, as bwrap's own.
    cmd = [*cmd, "/bin/sh", "-c", '"$@"; exit $?', "sh", *drop_privileges_argv(inner)]
    if netns is not None:
        cmd = [NSENTER, f"--net={netns}", "--", *cmd]
    return cmd


def cgroup_wrapper(join_files: Sequence[Path], argv: Sequence[str]) -> list[str]:
    """`sh` joins every cgroup itself ("0": the writer; see `SandboxCgroup.join_files`), then
    execs: race-free, no preexec_fn in a threaded server."""
    joins = "".join(f"echo 0 > {shlex.quote(str(p))} && " for p in join_files)
    return ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *argv]
