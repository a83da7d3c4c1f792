"""The kernel boundary of a sandbox, on both launch routes (issue 17, issue 9 item 2).

From inside (tests/fixtures/kernel_probe.py): user namespaces, mount, keyctl, bpf, perf_event_open,
ptrace and the rest of what the seccomp profile denies fail with EPERM, and /proc/self/status shows
a filter, while what agents run (pipelines, threads, their own /proc) keeps working.
From outside: no process in a sandbox's pid namespace holds uid 0 in any slot, or a capability.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from ashd.sandboxing import ExitReason, SandboxLauncher
from tests.fixtures.sandboxes import (
    program_spec,
    route_launcher,  # noqa: F401 (the `launcher` fixture)
    wait_for,
)

pytestmark = pytest.mark.sandbox

DENIED = [
    "unshare_user",
    "unshare_mount",
    "clone_newuser",
    "unshare_U",
    "unshare_U_r_n",
    "unshare_U_r_mount",
    "mount",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "ptrace_sibling",
    "ptrace_child",
    "personality_no_aslr",
    "socket_vsock",
]
# What the operator's `ptrace` profile gives back; everything else stays denied.
PTRACE_EXTRAS = {"ptrace_sibling", "ptrace_child", "personality_no_aslr"}


def _probe(launcher: SandboxLauncher, sandbox_id: str, seccomp: str = "default") -> dict[str, Any]:
    paths = launcher.prepare(sandbox_id)
    spec = program_spec(paths, sandbox_id, "kernel_probe.py")
    if seccomp != "default":
        from dataclasses import replace

        spec = replace(spec, seccomp=seccomp)
    proc = launcher.launch(spec)
    info = proc.wait(120)
    proc.cleanup()
    log = (paths.logs / "sandbox.log").read_text()
    assert info.reason is ExitReason.NORMAL, log
    result: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def probe(launcher: SandboxLauncher) -> dict[str, Any]:
    return _probe(launcher, "probe")


@pytest.mark.parametrize("name", DENIED)
def test_denied_call_fails_with_eperm(probe: dict[str, Any], name: str) -> None:
    result = probe["calls"][name]
    assert result["errno"] == errno.EPERM, f"{name}: {result['detail']}"


def test_clone3_answers_enosys_so_libc_falls_back_to_clone(probe: dict[str, Any]) -> None:
    assert probe["calls"]["clone3"]["errno"] == errno.ENOSYS, probe["calls"]["clone3"]


def test_proc_status_shows_a_seccomp_filter(probe: dict[str, Any]) -> None:
    assert probe["seccomp"] == "2"  # SECCOMP_MODE_FILTER


def test_what_agents_run_still_works(probe: dict[str, Any]) -> None:
    assert all(w["ok"] for w in probe["works"].values()), probe["works"]
    assert probe["calls"]["personality_query"]["errno"] == 0


def test_ptrace_profile_allows_tracing_and_nothing_else(launcher: SandboxLauncher) -> None:
    probe = _probe(launcher, "probe-ptrace", seccomp="ptrace")
    assert probe["seccomp"] == "2"
    for name in DENIED:
        expected = 0 if name in PTRACE_EXTRAS else errno.EPERM
        assert probe["calls"][name]["errno"] == expected, f"{name}: {probe['calls'][name]['detail']}"


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def test_no_process_in_the_sandbox_pid_namespace_is_root(launcher: SandboxLauncher) -> None:
    """Seen from the host: real, effective, saved and fs uids and gids are never 0, no capability
    is held, no_new_privs is set and the filter is on, for pid 1 (the reaper) and the payload."""
    paths = launcher.prepare("uids")
    proc = launcher.launch(program_spec(paths, "uids", "ladder_double.py", "stubborn", "2"))
    try:
        wait_for(lambda: paths.bridge_socket.exists() or proc.poll() is not None, 60, "the payload to listen")
        assert proc.poll() is None, (paths.logs / "sandbox.log").read_text()
        inside = {}
        for pid in proc.sandbox_pids():
            status = _status(pid)
            if len(status["NSpid"].split()) > 1:  # in a pid namespace below the host's
                inside[pid] = status
        assert sorted(s["NSpid"].split()[-1] for s in inside.values())[:2] == ["1", "2"], inside
        assert len(inside) >= 4  # pid 1, the payload and its two children
        for pid, status in inside.items():
            assert "0" not in status["Uid"].split(), (pid, status["Uid"])
            assert "0" not in status["Gid"].split(), (pid, status["Gid"])
            for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
                assert int(status[caps], 16) == 0, (pid, caps, status[caps])
            assert status["NoNewPrivs"] == "1", pid
            assert status["Seccomp"] == "2", pid
    finally:
        proc.kill()
        proc.cleanup()
