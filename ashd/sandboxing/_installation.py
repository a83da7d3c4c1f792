"""What a sandbox needs from the Python installation that runs ashd, derived by rule.

The bridge inside a sandbox is `<sys.executable> -I -m ashd.bridge`, so it needs the interpreter
(its base prefix: binary, standard library, shared libraries), the environment ashd is installed in
(`sys.prefix`: a venv's site-packages, or the base itself) and the `ashd` package, wherever that is
(inside site-packages for a wheel, the checkout for an editable install). Nothing else of the host.

The rule, whatever the layout (venv, system install, editable checkout, symlinked paths):

1. each needed path is resolved; paths the system binds already show (`/usr`, ...) are dropped;
2. a path inside another needed path is dropped: the outer bind already shows it, and binding it
   again, or recreating its directories, would hide what the outer bind shows;
3. every remaining path is bound read-only at its real location, after creating its missing parent
   directories (never one that an earlier mount already made or shows);
4. a needed path that was given through a symlink gets that symlink in the sandbox too, unless it
   is already visible through a bind;
5. the server's data dir, if a bind or a system path would show it, is covered by an empty
   read-only directory: an installation that holds the data dir never exposes it.

An installation that lies where the sandbox mounts its own directories (/workspace, /home/agent,
/run/ashd, /dev, /proc, /etc) cannot be shown without one mount hiding the other, so it is refused
with a message that says why (`InstallationError`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import ashd
from ashd.errors import ConfigError

# Mount destinations the sandbox owns; an installation inside one (or above one) would be hidden
# by it (or hide part of it).
RESERVED_DESTS = ("/workspace", "/home/agent", "/run/ashd", "/dev", "/proc", "/etc")
MASK_DIR_NAME = ".empty"


class InstallationError(ConfigError):
    """The Python installation lies where a sandbox cannot show it."""


@dataclass(frozen=True)
class Installation:
    """The parts of a Python installation a sandbox needs, as the running interpreter names them."""

    base_prefix: str
    prefix: str
    package_dir: str
    executable: str

    @classmethod
    def current(cls) -> Installation:
        return cls(sys.base_prefix, sys.prefix, str(Path(ashd.__file__).parent), sys.executable)

    def needed(self) -> list[str]:
        """Paths as given (maybe through symlinks), most general first."""
        exe_dir = os.path.dirname(self.executable)
        real_exe_dir = os.path.dirname(os.path.realpath(self.executable))
        return [self.base_prefix, self.prefix, self.package_dir, exe_dir, real_exe_dir]


@dataclass(frozen=True)
class MountSpec:
    """One entry of the install part of a mount plan: kind `dir`, `ro-bind` or `symlink`."""

    kind: str
    dest: str
    src: str = ""


def is_under(path: str, root: str) -> bool:
    """True if `path` is `root` or inside it (lexically; both absolute and normalised)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _under_any(path: str, roots: Iterable[str]) -> bool:
    return any(is_under(path, r) for r in roots)


def _parents(path: str) -> list[str]:
    """Ancestors of `path` from the top, without `/` and without `path` itself."""
    return [str(p) for p in reversed(Path(path).parents) if str(p) != "/"]


def _check_reserved(path: str, reserved: Sequence[str]) -> None:
    for dest in reserved:
        if is_under(path, dest) or is_under(dest, path):
            raise InstallationError(
                f"the Python installation path {path} overlaps {dest}, which every sandbox mounts "
                "for itself; install ashd and its interpreter elsewhere (for example under /opt or "
                "/usr/local)"
            )


def install_mounts(
    inst: Installation,
    *,
    system_roots: Sequence[str],
    made: Iterable[str],
    data_dir: Path,
    reserved: Sequence[str] = RESERVED_DESTS,
) -> list[MountSpec]:
    """The mounts that show `inst` inside a sandbox (see the module docstring for the rule).

    `system_roots`: host paths the plan already binds or links at the same place (`/usr`, ...).
    `made`: destinations earlier entries of the plan create (`/tmp`, `/home`, ...): never recreated.
    """
    made_dirs = set(made)
    pairs = [(os.path.normpath(p), os.path.realpath(p)) for p in inst.needed() if p]
    binds: list[str] = []
    for real in sorted({r for _, r in pairs}, key=lambda r: (r.count("/"), r)):
        if _under_any(real, system_roots) or _under_any(real, binds):
            continue
        _check_reserved(real, reserved)
        binds.append(real)
    out: list[MountSpec] = []

    def make_parents(path: str) -> None:
        for parent in _parents(path):
            if parent in made_dirs or _under_any(parent, system_roots):
                continue
            made_dirs.add(parent)
            out.append(MountSpec("dir", parent))

    for real in binds:
        make_parents(real)
        out.append(MountSpec("ro-bind", real, real))
        made_dirs.add(real)
    links: list[str] = []
    for given, real in sorted(set(pairs), key=lambda p: (p[0].count("/"), p[0])):
        shown = (system_roots, binds, links)
        if given == real or any(_under_any(given, roots) for roots in shown) or given in made_dirs:
            continue
        _check_reserved(given, reserved)
        make_parents(given)
        out.append(MountSpec("symlink", given, real))
        links.append(given)
    data_real = os.path.realpath(data_dir)
    if _under_any(data_real, binds) or _under_any(data_real, system_roots):
        out.append(MountSpec("ro-bind", data_real, str(mask_dir(data_dir))))
    return out


def mask_dir(data_dir: Path) -> Path:
    """An empty directory bound over a data dir that an installation bind would otherwise show."""
    return data_dir / "sandboxes" / MASK_DIR_NAME


def prepare(data_dir: Path, system_roots: Sequence[str], made: Iterable[str]) -> list[MountSpec]:
    """At launcher start: check the current installation can be shown (InstallationError if not)
    and create the empty mask directory."""
    d = mask_dir(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o555)  # noqa: S103  (an empty, read-only mount point; nothing to hide in it)
    return list(cached_mounts(Installation.current(), tuple(system_roots), tuple(made), str(data_dir)))


@functools.lru_cache(maxsize=8)
def cached_mounts(inst: Installation, system_roots: tuple[str, ...], made: tuple[str, ...],
                  data_dir: str) -> tuple[MountSpec, ...]:
    """`install_mounts` once per layout: the answer only changes if the installation moves."""
    return tuple(install_mounts(inst, system_roots=system_roots, made=made, data_dir=Path(data_dir)))
