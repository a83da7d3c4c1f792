"""What a sandbox sees: one mount plan, applied by bwrap or by the zygote child alike.

Both launch routes translate the same list of `Mount`s, so their isolation cannot drift apart.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ashd.sandboxing import _installation
from ashd.sandboxing._types import SANDBOX_HOME, SANDBOX_RUN, SANDBOX_WORKSPACE, SandboxSpec

# Defined with the fork server's child, which must not import this package (`ashd/zygote`).
from ashd.zygote import HOSTNAME as HOSTNAME
from ashd.zygote import SANDBOX_GID as SANDBOX_GID
from ashd.zygote import SANDBOX_UID as SANDBOX_UID
from ashd.zygote import Mount as Mount

SANDBOX_USER = "agent"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Host paths the dynamic loader, Python and TLS need. Symlinks (merged /usr) are recreated as links.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_ETC_PATHS = (
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/mime.types",
)


def etc_dir(data_dir: Path) -> Path:
    return data_dir / "sandboxes" / ".etc"


def write_etc_files(data_dir: Path, resolv_conf: str = "") -> Path:
    """The synthesized /etc/passwd, group, hosts and, for networked sandboxes, resolv.conf (no host
    accounts, names or search domains leak in)."""
    d = etc_dir(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "resolv.conf": resolv_conf,
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:agent:{SANDBOX_HOME}:/bin/sh\n",
        "group": f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_GID}:\n",
        "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }
    for name, text in files.items():
        path = d / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(path)
    return d


def system_roots() -> tuple[str, ...]:
    """Host paths the plan shows at the same place: whatever lies under them needs no bind."""
    return tuple(p for p in _SYSTEM_PATHS if os.path.lexists(p))


def check_installation(data_dir: Path) -> None:
    """At launcher start: refuse an installation a sandbox cannot show (InstallationError), and
    make the empty directory that masks a data dir an installation bind would show."""
    made = tuple(m.dest for m in _base_plan(data_dir, network=False, tmp=""))  # destinations only
    _installation.prepare(data_dir, system_roots(), made)


def _system_mount(path: str) -> Mount | None:
    if os.path.islink(path):
        return Mount("symlink", path, os.readlink(path))
    if os.path.exists(path):
        return Mount("ro-bind", path, path)
    return None


def _with_parents(plan: list[Mount]) -> list[Mount]:
    """Every destination's missing parents as explicit 0755 dirs, before their first use.

    bwrap creates missing parents 0700 and root-owned, which the sandbox uid cannot walk: a bind
    at /etc/ssl would leave /etc (and every file bound below it) unreachable for the payload.
    A parent inside an earlier bind is the host's own directory, shown by that bind: making it
    again would write into a read-only mount (the zygote's chmod fails with EROFS).
    """
    made = {"/"}
    shown: list[str] = []
    out: list[Mount] = []
    for m in plan:
        for parent in reversed(Path(m.dest).parents):
            p = str(parent)
            if p not in made and not any(_installation.is_under(p, b) for b in shown):
                made.add(p)
                out.append(Mount("dir", p))
        made.add(m.dest)
        if m.kind in ("ro-bind", "bind"):
            shown.append(m.dest)
        out.append(m)
    return out


def _base_plan(data_dir: Path, *, network: bool, tmp: str) -> list[Mount]:
    """System paths, /etc and the fresh mounts: everything before the Python installation.
    `tmp`: the host directory shown as the sandbox's /tmp."""
    plan: list[Mount] = []
    for path in _SYSTEM_PATHS:
        m = _system_mount(path)
        if m is not None:
            plan.append(m)
    # Made explicitly: bwrap would create /etc as the 0700 parent of its first bind, and the
    # sandbox user could then read none of it (passwd, TLS certificates, resolv.conf).
    plan.append(Mount("dir", "/etc"))
    for path in _ETC_PATHS:
        m = _system_mount(path)
        if m is not None:
            plan.append(m)
    etc = etc_dir(data_dir)
    names = ("passwd", "group", "hosts", "nsswitch.conf") + (("resolv.conf",) if network else ())
    for name in names:
        plan.append(Mount("ro-bind", f"/etc/{name}", str(etc / name)))
    # The private /tmp (and the other fresh mounts) come before the interpreter binds: a venv or a
    # checkout that lives under /tmp on the host would otherwise be hidden by the new /tmp. It is on
    # the sandbox's disk, like the workspace: a tmpfs would count against memory and end in OOM
    # kills, where a full disk gives a plain "No space left on device".
    plan += [
        Mount("dir", "/home"),
        Mount("dir", "/run"),
        Mount("dev", "/dev"),
        Mount("proc", "/proc"),
        Mount("bind", "/tmp", tmp),
    ]
    return plan


# Stand-ins for a sandbox's own directories in the cached plan (no host path starts with NUL).
_OWN = ("\0tmp", "\0workspace", "\0home", "\0run")


def mount_plan(spec: SandboxSpec, data_dir: Path) -> list[Mount]:
    own = dict(zip(_OWN, (str(spec.paths.tmp), str(spec.paths.workspace), str(spec.paths.home),
                          str(spec.paths.run)), strict=True))
    return [Mount(m.kind, m.dest, own[m.src]) if m.src in own else m
            for m in _plan_for(data_dir, sys.executable, spec.network)]


@functools.lru_cache(maxsize=16)
def _plan_for(data_dir: Path, executable: str, network: bool) -> tuple[Mount, ...]:
    """Every sandbox's plan but its own directories: the host's system paths and the installation
    are read once per process (half a millisecond of a launch's CPU otherwise, mostly the parents'
    walk), as the installation's binds always were (`_installation.cached_mounts`)."""
    tmp, workspace, home, run = _OWN
    plan = _base_plan(data_dir, network=network, tmp=tmp)
    # The interpreter, the environment and the ashd package, by rule (see _installation).
    plan += [Mount(m.kind, m.dest, m.src) for m in _installation.cached_mounts(
        _installation.Installation.current(), system_roots(), tuple(m.dest for m in plan), str(data_dir))]
    plan += [
        Mount("bind", SANDBOX_WORKSPACE, workspace),
        Mount("bind", SANDBOX_HOME, home),
        Mount("bind", SANDBOX_RUN, run),
    ]
    return tuple(_with_parents(plan))


def sandbox_env(spec_env: Mapping[str, str]) -> dict[str, str]:
    """Basics first; the caller's env is final and wins."""
    env = {
        "PATH": f"{sys.prefix}/bin:{BASE_PATH}",
        "HOME": SANDBOX_HOME,
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(spec_env)
    return env


def default_argv(listen_fd: int | None = None) -> tuple[str, ...]:
    """The bridge's command line; `listen_fd`: the inherited socket it serves on (`_activation`)."""
    argv = (sys.executable, "-I", "-m", "ashd.bridge", "--socket", f"{SANDBOX_RUN}/bridge.sock")
    return argv if listen_fd is None else (*argv, "--listen-fd", str(listen_fd))
