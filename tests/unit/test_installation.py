"""The installation part of a sandbox's mount plan, derived by rule for every way ashd is installed:
a wheel in a venv, an editable checkout, a system install, symlinked paths, a data dir inside the
installation, and a layout no sandbox can show. Real directories and symlinks under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ashd.sandboxing import _layout
from ashd.sandboxing._installation import (
    Installation,
    InstallationError,
    MountSpec,
    install_mounts,
    is_under,
    mask_dir,
)
from ashd.sandboxing._layout import Mount
from ashd.sandboxing._types import SandboxPaths, SandboxSpec

SYSTEM = ("/usr", "/bin", "/lib")
MADE = ("/home", "/run", "/dev", "/proc", "/tmp")


def mkdirs(*paths: Path) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)


def interpreter(root: Path) -> Path:
    base = root / "pythons" / "3.11"
    mkdirs(base / "bin", base / "lib" / "python3.11")
    (base / "bin" / "python3.11").write_text("")
    return base


def venv(root: Path, base: Path, name: str = "venv") -> Path:
    env = root / name
    site = env / "lib" / "python3.11" / "site-packages"
    mkdirs(env / "bin", site)
    (env / "bin" / "python").symlink_to(base / "bin" / "python3.11")
    return env


def assert_no_mount_hides_another(plan: list[MountSpec] | list[Mount]) -> None:
    """Every later mount lands where nothing earlier is shown, except a declared mask (an empty
    ro-bind from the data dir's mask directory); no directory is recreated."""
    dests: list[tuple[str, str]] = []
    for m in plan:
        for kind, dest in dests:
            # The sandbox's own /tmp is fresh (its own directory): what lands there hides nothing.
            fresh = dest == "/tmp"
            if kind in ("ro-bind", "bind") and not fresh and is_under(m.dest, dest) and not m.src.endswith("/.empty"):
                raise AssertionError(f"{m} lands inside the earlier bind {dest}")
            if m.dest == dest:
                raise AssertionError(f"{m} recreates {dest}")
        dests.append((m.kind, m.dest))


def plan_for(inst: Installation, data_dir: Path) -> list[MountSpec]:
    plan = install_mounts(inst, system_roots=SYSTEM, made=MADE, data_dir=data_dir)
    assert_no_mount_hides_another(plan)
    return plan


def binds(plan: list[MountSpec]) -> list[str]:
    return [m.dest for m in plan if m.kind == "ro-bind"]


def test_a_wheel_in_a_venv_binds_the_interpreter_and_the_venv_once_each(tmp_path: Path) -> None:
    base = interpreter(tmp_path)
    env = venv(tmp_path, base)
    package = env / "lib" / "python3.11" / "site-packages" / "ashd"
    mkdirs(package)

    plan = plan_for(Installation(str(base), str(env), str(package), str(env / "bin" / "python")), tmp_path / "data")

    assert sorted(binds(plan)) == sorted([str(base), str(env)])
    # Parents are created before their bind and never inside one.
    dirs = [m.dest for m in plan if m.kind == "dir"]
    assert str(tmp_path) in dirs and not any(is_under(d, str(env)) or is_under(d, str(base)) for d in dirs)
    assert plan.index(MountSpec("dir", str(tmp_path))) < plan.index(MountSpec("ro-bind", str(env), str(env)))


def test_an_editable_checkout_adds_only_the_package_directory(tmp_path: Path) -> None:
    base = interpreter(tmp_path)
    env = venv(tmp_path, base)
    checkout = tmp_path / "checkout"
    mkdirs(checkout / "ashd", checkout / "data")

    plan = plan_for(Installation(str(base), str(env), str(checkout / "ashd"), str(env / "bin" / "python")),
                    checkout / "data")

    assert sorted(binds(plan)) == sorted([str(base), str(env), str(checkout / "ashd")])
    # The checkout's data dir is beside the package, not under a bind: nothing to mask.
    assert not any(m.src.endswith("/.empty") for m in plan)


def test_a_system_install_needs_nothing_beyond_the_system_binds() -> None:
    inst = Installation("/usr", "/usr", "/usr/lib/python3/dist-packages/ashd", "/usr/bin/python3")
    assert install_mounts(inst, system_roots=SYSTEM, made=MADE, data_dir=Path("/var/lib/ashd")) == []


def test_a_venv_under_the_private_tmp_is_bound_on_the_new_tmpfs_without_recreating_tmp(tmp_path: Path) -> None:
    base = interpreter(tmp_path)
    env = venv(tmp_path, base)
    inst = Installation(str(base), str(env), str(env / "lib" / "python3.11" / "site-packages" / "ashd"),
                        str(env / "bin" / "python"))
    plan = install_mounts(inst, system_roots=SYSTEM, made=(*MADE, str(tmp_path.parent)), data_dir=tmp_path / "d")
    assert MountSpec("dir", "/tmp") not in plan and MountSpec("dir", str(tmp_path.parent)) not in plan


def test_paths_given_through_symlinks_are_bound_at_their_real_place_and_linked(tmp_path: Path) -> None:
    base = interpreter(tmp_path)
    real_env = venv(tmp_path / "srv", base)
    (tmp_path / "opt").mkdir()
    link = tmp_path / "opt" / "ashd"
    link.symlink_to(real_env)
    package = link / "lib" / "python3.11" / "site-packages" / "ashd"
    mkdirs(package)

    plan = plan_for(Installation(str(base), str(link), str(package), str(link / "bin" / "python")), tmp_path / "data")

    assert sorted(binds(plan)) == sorted([str(base), str(real_env)])
    assert MountSpec("symlink", str(link), str(real_env)) in plan
    # Only the venv itself gets a link: its bin/ and the package are visible through it.
    assert [m for m in plan if m.kind == "symlink"] == [MountSpec("symlink", str(link), str(real_env))]


def test_a_data_dir_inside_the_installation_is_covered_by_an_empty_directory(tmp_path: Path) -> None:
    base = interpreter(tmp_path)
    env = venv(tmp_path, base, name="opt-ashd")
    data = env / "data"
    mkdirs(data, env / "lib" / "python3.11" / "site-packages" / "ashd")

    plan = plan_for(Installation(str(base), str(env), str(env / "lib/python3.11/site-packages/ashd"),
                                 str(env / "bin" / "python")), data)

    assert plan[-1] == MountSpec("ro-bind", str(data), str(mask_dir(data)))
    assert plan.index(MountSpec("ro-bind", str(env), str(env))) < len(plan) - 1


@pytest.mark.parametrize("where", ["/home/agent/venv", "/workspace", "/run/ashd/py", "/etc/py"])
def test_an_installation_where_the_sandbox_mounts_its_own_dirs_is_refused(where: str) -> None:
    inst = Installation("/usr", where, f"{where}/lib/python3.11/site-packages/ashd", f"{where}/bin/python")
    with pytest.raises(InstallationError, match=f"{where}.*install ashd and its interpreter elsewhere"):
        install_mounts(inst, system_roots=SYSTEM, made=MADE, data_dir=Path("/var/lib/ashd"))


def test_the_running_installation_gives_a_plan_where_no_mount_hides_another(tmp_path: Path) -> None:
    paths = SandboxPaths(tmp_path / "sb")
    spec = SandboxSpec(sandbox_id="sb", paths=paths, env={}, argv=("true",))
    plan = _layout.mount_plan(spec, tmp_path)
    assert_no_mount_hides_another(plan)
    # The interpreter this test runs on is reachable: its real binary is under a bind or a system path.
    exe = os.path.realpath(sys.executable)
    shown = [m.dest for m in plan if m.kind in ("ro-bind", "symlink")]
    assert any(is_under(exe, d) for d in shown)
