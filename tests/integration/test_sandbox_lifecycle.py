"""Sandbox lifecycle on both launch routes: exit reasons, the shutdown ladder, cleanup, orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ashd.errors import ConfigError
from ashd.sandboxing import (
    ExitReason,
    LauncherConfig,
    SandboxLauncher,
    SandboxProcess,
    SandboxSpec,
    ShutdownRung,
)
from tests.fixtures.sandboxes import (
    ROUTES,
    TEST_LIMITS,
    program_spec,
    require_isolation,
    route_launcher,  # noqa: F401 (the `launcher` fixture)
    wait_for,
)

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_double(launcher: SandboxLauncher, sandbox_id: str, mode: str, children: int = 0) -> SandboxProcess:
    paths = launcher.prepare(sandbox_id)
    proc = launcher.launch(program_spec(paths, sandbox_id, "ladder_double.py", mode, str(children)))
    if mode != "exit":
        wait_for(lambda: paths.bridge_socket.exists() or proc.poll() is not None, 30, "the double to listen")
        assert proc.poll() is None, (paths.logs / "sandbox.log").read_text()
    return proc


def _send_shutdown(proc: SandboxProcess) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(proc.paths.bridge_socket))
        s.sendall(b"shutdown\n")


def _inline(launcher: SandboxLauncher, sandbox_id: str, code: str) -> SandboxProcess:
    paths = launcher.prepare(sandbox_id)
    return launcher.launch(SandboxSpec(sandbox_id, paths, argv=(sys.executable, "-I", "-c", code)))


def test_normal_and_error_exits(launcher: SandboxLauncher) -> None:
    ok = _inline(launcher, "exit0", "print('hello')")
    bad = _inline(launcher, "exit3", "raise SystemExit(3)")
    assert ok.wait(30).reason is ExitReason.NORMAL
    info = bad.wait(30)
    assert (info.returncode, info.reason) == (3, ExitReason.ERROR)
    assert "hello" in (ok.paths.logs / "sandbox.log").read_text()
    ok.cleanup()
    bad.cleanup()


def test_killed_by_a_signal_is_not_out_of_memory(launcher: SandboxLauncher) -> None:
    proc = _start_double(launcher, "killed", "stubborn")
    proc.kill()
    info = proc.wait(30)
    assert info.reason is ExitReason.SIGNALLED
    assert info.returncode == -signal.SIGKILL
    proc.cleanup()


def test_wait_times_out_while_running(launcher: SandboxLauncher) -> None:
    proc = _start_double(launcher, "waiting", "obey")
    with pytest.raises(TimeoutError):
        proc.wait(0.05)
    assert proc.poll() is None
    assert proc.memory_bytes() > 0
    assert proc.pss_bytes() > 0
    proc.cleanup()


@pytest.mark.parametrize(
    ("mode", "rung"),
    [
        ("exit", ShutdownRung.ALREADY_EXITED),
        ("obey", ShutdownRung.PROTOCOL),
        ("ignore", ShutdownRung.SIGTERM),
        ("stubborn", ShutdownRung.SIGKILL),
    ],
)
def test_shutdown_ladder_reaches_the_right_rung(
    launcher: SandboxLauncher, mode: str, rung: ShutdownRung
) -> None:
    proc = _start_double(launcher, f"ladder-{mode}", mode)
    if mode == "exit":
        proc.wait(30)
    assert proc.shutdown(lambda: _send_shutdown(proc), grace=1.0) is rung
    info = proc.poll()
    assert info is not None
    if rung is ShutdownRung.SIGTERM:
        assert info.returncode == -signal.SIGTERM
    if rung is ShutdownRung.SIGKILL:
        assert info.returncode == -signal.SIGKILL
    proc.cleanup()


def test_shutdown_without_a_protocol_callback_starts_at_sigterm(launcher: SandboxLauncher) -> None:
    proc = _start_double(launcher, "ladder-none", "ignore")
    assert proc.shutdown(None, grace=1.0) is ShutdownRung.SIGTERM
    proc.cleanup()


def test_cleanup_leaves_no_process_cgroup_or_socket(launcher: SandboxLauncher) -> None:
    proc = _start_double(launcher, "leaves", "stubborn", children=3)
    assert proc.cgroup is not None
    # The payload and its 3 children (what runs above them differs per route).
    wait_for(lambda: len(proc._payload_pids()) >= 4, 30, "the double's children")
    pids = proc.sandbox_pids()
    proc.cleanup()
    proc.cleanup()  # idempotent
    assert not any(_alive(p) for p in pids)
    assert not any(d.exists() for d in proc.cgroup.dirs.values())
    assert list(proc.paths.run.glob("*.sock")) == []


def test_every_sandbox_process_is_in_each_of_its_cgroups(launcher: SandboxLauncher) -> None:
    """The join (v1: a thread's own move into `tasks`) takes the whole sandbox: its init, the
    payload and the payload's children, in every controller's cgroup, and nothing else there."""
    proc = _start_double(launcher, "joined", "stubborn", children=2)
    try:
        assert proc.cgroup is not None
        wait_for(lambda: len(proc._payload_pids()) >= 3, 30, "the double's children")
        root = psutil.Process(proc.pid)  # the tree as the host sees it, not as the cgroup says
        pids = {proc.pid} | {c.pid for c in root.children(recursive=True)}
        assert len(pids) >= 4
        for controller, directory in proc.cgroup.dirs.items():
            members = {int(p) for p in (directory / "cgroup.procs").read_text().split()}
            assert members == pids, controller
    finally:
        proc.kill()
        proc.wait(30)
        proc.cleanup()


def test_a_killed_sandbox_is_reaped_whole_when_wait_returns(launcher: SandboxLauncher) -> None:
    proc = _start_double(launcher, "reaped", "stubborn", children=3)
    assert proc.cgroup is not None
    wait_for(lambda: len(proc._payload_pids()) >= 4, 30, "the double's children")
    pids = proc.sandbox_pids()
    proc.kill()
    assert proc.wait(30).returncode == -signal.SIGKILL
    # Reaped, not merely dead: a pid 1 orphaned to the host's init lingers as a zombie (or still
    # waits for its own zombies) for as long as that init takes to reap it.
    assert proc.cgroup.charged() == 0
    assert not any(psutil.pid_exists(p) for p in pids)
    proc.cleanup()


def test_destroy_dirs_can_keep_the_workspace(launcher: SandboxLauncher) -> None:
    paths = launcher.prepare("keeper")
    (paths.workspace / "file.txt").write_text("kept")
    launcher.destroy_dirs("keeper", keep_workspace=True)
    assert (paths.workspace / "file.txt").read_text() == "kept"
    assert not paths.home.exists()
    launcher.destroy_dirs("keeper")
    assert not paths.root.exists()


@pytest.mark.parametrize("route", ROUTES)
def test_sandboxes_die_with_a_killed_server_and_the_next_start_sweeps(tmp_path: Path, route: str) -> None:
    require_isolation()
    parent = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.launcher_parent", str(tmp_path), route],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        state = json.loads(parent.stdout.readline())
        # pid 1, payload and two grandchildren each; the bwrap route adds its host-side processes
        assert len(state["pids"]) >= 2 * 4
        assert all(_alive(p) for p in state["pids"])
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        if parent.stdin is not None:
            parent.stdin.close()
        if parent.stdout is not None:
            parent.stdout.close()
    wait_for(lambda: not any(_alive(p) for p in state["pids"]), 30, "the orphaned sandboxes to die")
    # The cgroups and sockets a killed server leaves are swept by the next start.
    launcher = SandboxLauncher(LauncherConfig(tmp_path, TEST_LIMITS, use_zygote=False))
    launcher.start()
    try:
        assert not any(Path(d).exists() for d in state["cgroups"])
        assert not any(Path(s).exists() for s in state["sockets"])
    finally:
        launcher.stop()


def test_stop_kills_every_sandbox_and_removes_our_cgroups(tmp_path: Path) -> None:
    require_isolation()
    launcher = SandboxLauncher(LauncherConfig(tmp_path, TEST_LIMITS, use_zygote=True))
    launcher.start()
    proc = _start_double(launcher, "at-stop", "stubborn", children=1)
    pids = proc.sandbox_pids()
    assert proc.cgroup is not None
    parents = [d.parent for d in proc.cgroup.dirs.values()]
    launcher.stop()
    assert not any(_alive(p) for p in pids)
    assert not any(d.exists() for d in parents)


def test_a_host_that_cannot_isolate_refuses_to_start(tmp_path: Path) -> None:
    config = LauncherConfig(tmp_path, TEST_LIMITS, bwrap="/nonexistent/bwrap")
    with pytest.raises(ConfigError, match="bubblewrap"):
        SandboxLauncher(config).start()


def test_weak_isolation_runs_plain_children_with_a_clean_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASHD_TEST_SECRET", "weak-secret")
    config = LauncherConfig(tmp_path, TEST_LIMITS, bwrap="/nonexistent/bwrap", allow_weak_isolation=True)
    launcher = SandboxLauncher(config)
    launcher.start()
    try:
        assert launcher.isolation.weak
        paths = launcher.prepare("weak")
        code = "import os, json; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
        argv = (sys.executable, "-I", "-c", code)
        proc = launcher.launch(SandboxSpec("weak", paths, env={"GIVEN": "1"}, argv=argv))
        assert proc.wait(30).reason is ExitReason.NORMAL
        seen = json.loads((paths.logs / "sandbox.log").read_text().strip().splitlines()[-1])
        proc.cleanup()
    finally:
        launcher.stop()
    assert "weak-secret" not in json.dumps(seen["env"])
    assert seen["env"]["GIVEN"] == "1"
    assert seen["cwd"] == str(paths.workspace)
