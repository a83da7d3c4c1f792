"""The seccomp profiles compile, differ only where they should, and the bwrap command line
carries the filter and the user-namespace lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ashd.config import load_settings
from ashd.errors import ConfigError
from ashd.sandboxing import _seccomp, _seccomp_profile
from ashd.sandboxing._bwrap import bwrap_argv
from ashd.sandboxing._layout import mount_plan
from ashd.sandboxing._types import SandboxPaths, SandboxSpec


def test_every_profile_compiles_to_classic_bpf() -> None:
    programs = _seccomp.SeccompPrograms.compile_all()
    assert set(programs.programs) == set(_seccomp_profile.PROFILES)
    for program in programs.programs.values():
        assert len(program) % 8 == 0 and 0 < len(program) // 8 < 4096  # BPF_MAXINSNS
    assert programs.program("default") != programs.program("ptrace")
    with pytest.raises(ValueError, match="unknown seccomp profile"):
        programs.program("unconfined")


def test_the_profile_denies_what_the_issue_lists() -> None:
    allowed = set(_seccomp_profile.DOCKER_ALLOW)
    for call in ("unshare", "setns", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key",
                 "bpf", "perf_event_open", "userfaultfd", "kexec_load", "init_module", "finit_module",
                 "delete_module", "ptrace", "acct", "swapon", "reboot", "settimeofday", "open_by_handle_at",
                 "io_uring_setup", "clone3", "clone", "personality", "socket"):
        assert call not in allowed, call  # never unconditional (clone/personality/socket: filtered)


def test_program_fd_is_private_and_readable_from_the_start() -> None:
    fd = _seccomp.program_fd(b"x" * 16)
    try:
        assert not os.get_inheritable(fd)  # only pass_fds hands it to bwrap
        assert os.read(fd, 64) == b"x" * 16
    finally:
        os.close(fd)


def test_bwrap_route_locks_user_namespaces_and_loads_the_filter(tmp_path: Path) -> None:
    spec = SandboxSpec("s", SandboxPaths(tmp_path / "sandboxes" / "s"))
    cmd = bwrap_argv(mount_plan(spec, tmp_path), {"A": "1"}, ["/bin/true"], netns=None, seccomp_fd=7)
    split = cmd.index("/usr/bin/setpriv")
    outer, inner = cmd[:split], cmd[cmd.index("--", split) + 1:]
    assert "--unshare-user" not in outer and "--unshare-net" in outer
    assert cmd[split - 5:split] == ["--", "/bin/sh", "-c", '"$@"; exit $?', "sh"]  # the root holder
    for flag in ("--unshare-user", "--disable-userns", "--unshare-pid", "--die-with-parent"):
        assert flag in inner
    assert inner[inner.index("--seccomp") + 1] == "7"
    assert inner[inner.index("--uid") + 1] == "65534"
    assert inner[inner.index("--proc"):inner.index("--proc") + 2] == ["--proc", "/proc"]


def test_ptrace_agents_setting_names_tenant_and_agent() -> None:
    s = load_settings({"SERVICE_SANDBOX_PTRACE_AGENTS": "default/debugger, acme/gdb-box"})
    assert s.sandbox_ptrace_agents == ("default/debugger", "acme/gdb-box")
    assert s.seccomp_profile("default", "debugger") == "ptrace"
    assert s.seccomp_profile("acme", "debugger") == "default"  # another tenant's agent of that name
    assert load_settings({}).seccomp_profile("default", "debugger") == "default"
    for bad in ("debugger", "/debugger", "default/", "default/bad name"):
        with pytest.raises(ConfigError, match="SERVICE_SANDBOX_PTRACE_AGENTS"):
            load_settings({"SERVICE_SANDBOX_PTRACE_AGENTS": bad})
