"""The bridge as its sandbox's pid 1 (the zygote route), and the orphans of its commands.

On the zygote route the bridge is the init of its pid namespace: one process per idle sandbox,
not root, filtered, and the reaper of every orphan its commands leave. On bwrap's route bwrap's
own init reaps them. On both, no zombie outlives its grace, the exit codes of commands stay
theirs, and SIGTERM still stops a bridge (a pid 1 ignores signals it has no handler for).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ashd.sandboxing import SandboxLauncher, SandboxProcess, ShutdownRung
from tests.fixtures.sandboxes import (
    bridge_exec,
    launch_bridge,
    require_isolation,
    route_launcher,  # noqa: F401 (the `launcher` fixture)
    started_launcher,
    stop_sandbox,
)

pytestmark = pytest.mark.sandbox

# A background job that outlives its shell, and a daemon (fork, setsid, the parent exits): both are
# handed to the sandbox's pid 1 when their parent exits.
ORPHANS = "sleep 0.3 & python3 -c 'import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(0.3)' ; exit 7"


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def _namespace_processes(proc: SandboxProcess) -> dict[int, dict[str, str]]:
    """Every process of the sandbox's pid namespace, zombies included (a cgroup lists no zombie)."""
    inits = [p for p in proc.sandbox_pids() if _status(p)["NSpid"].split()[-1] == "1"]
    assert len(inits) == 1, proc.sandbox_pids()
    ns = os.readlink(f"/proc/{inits[0]}/ns/pid")
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    found[int(entry)] = _status(int(entry))
            except OSError:
                pass
    return found


def _zombies(proc: SandboxProcess) -> list[str]:
    return [s["Name"] for s in _namespace_processes(proc).values() if s["State"].startswith("Z")]


def test_orphans_are_reaped_and_exit_codes_kept(launcher: SandboxLauncher) -> None:
    proc = launch_bridge(launcher, "init-orphans")
    try:
        bridge_exec(proc, ["true"])  # the bridge is up
        idle = _namespace_processes(proc)  # the bridge, below bwrap's init on bwrap's route
        for _ in range(3):
            result = bridge_exec(proc, ["sh", "-c", ORPHANS])
            assert result["exitCode"] == 7, result
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _namespace_processes(proc).keys() != idle.keys():
            time.sleep(0.05)
        assert _zombies(proc) == []
        assert _namespace_processes(proc).keys() == idle.keys()
        assert proc.poll() is None, (proc.paths.logs / "sandbox.log").read_text()
    finally:
        stop_sandbox(proc)


def test_on_the_zygote_route_the_bridge_is_pid_1_unprivileged_and_filtered(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    require_isolation()
    with started_launcher(tmp_path_factory.mktemp("init-z"), "zygote") as launcher:  # short: a socket path
        _check_alone(launch_bridge(launcher, "init-alone"))


def _check_alone(proc: SandboxProcess) -> None:
    try:
        assert proc.init_is_payload
        bridge_exec(proc, ["true"])  # the bridge is up
        pids = proc.sandbox_pids()
        assert pids == [proc.pid], pids  # one process: no separate init
        status = _status(proc.pid)
        assert status["NSpid"].split()[-1] == "1"
        assert "0" not in status["Uid"].split() and "0" not in status["Gid"].split(), status
        for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"):
            assert int(status[caps], 16) == 0, (caps, status[caps])
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    finally:
        stop_sandbox(proc)


def test_sigterm_stops_the_bridge(launcher: SandboxLauncher) -> None:
    proc = launch_bridge(launcher, "init-term")
    try:
        bridge_exec(proc, ["true"])
        assert proc.shutdown(None, grace=10) == ShutdownRung.SIGTERM
        assert proc.wait(10).returncode == 0
    finally:
        stop_sandbox(proc)
