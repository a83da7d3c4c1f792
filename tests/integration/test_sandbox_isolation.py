"""Break-out attempts from inside real sandboxes, on both launch routes (bwrap and zygote).

Each attempt runs inside the sandbox (tests/fixtures/breakout.py) and must be refused.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ashd.sandboxing import ExitReason, SandboxLimits, SandboxSpec
from tests.fixtures.sandboxes import ROUTES, program_spec, require_isolation, started_launcher

pytestmark = pytest.mark.sandbox

SECRET = "ashd-test-secret-7f3a9c"
ATTEMPTS = [
    "read_other_workspace",
    "read_database",
    "list_data_dir",
    "server_environ",
    "pid1_environ",
    "own_environ",
    "write_usr",
    "write_root",
    "write_etc",
    "write_data_dir",
    "write_python_prefix",
    "tcp_loopback_host",
    "tcp_external",
    "see_server_process",
    "become_root",
    "mount",
]


class _Listener:
    """A host-side TCP listener on 127.0.0.1 that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
            self.accepted.set()
            conn.close()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module", params=ROUTES)
def breakout(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    require_isolation()
    route = request.param
    os.environ["ASHD_TEST_SECRET"] = SECRET  # in the server's environment, before the launcher starts
    data_dir = tmp_path_factory.mktemp(f"breakout-{route}")
    (data_dir / "ashd.db").write_text("SQLite format 3 pretend database")
    listener = _Listener()
    try:
        with started_launcher(data_dir, route) as launcher:
            other = launcher.prepare("victim")
            (other.workspace / "private.txt").write_text("the victim's files")
            paths = launcher.prepare("attacker")
            cfg = {
                "other_workspace_file": str(other.workspace / "private.txt"),
                "db_file": str(data_dir / "ashd.db"),
                "data_dir": str(data_dir),
                "server_pid": os.getpid(),
                "secret": SECRET,
                "tcp_port": listener.port,
            }
            spec = program_spec(paths, "attacker", "breakout.py", json.dumps(cfg), env={"VISIBLE": "yes"})
            proc = launcher.launch(spec)
            info = proc.wait(60)
            proc.cleanup()
            log = (paths.logs / "sandbox.log").read_text()
            assert info.reason is ExitReason.NORMAL, log
            verdict = json.loads(log.strip().splitlines()[-1])
            created = paths.workspace / "created-inside"
            yield {
                "verdict": verdict,
                "created_owner": created.stat().st_uid,
                "listener": listener,
                "data_dir": data_dir,
                "route": route,
            }
    finally:
        listener.close()
        os.environ.pop("ASHD_TEST_SECRET", None)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_breakout_attempt_is_refused(breakout: dict[str, Any], name: str) -> None:
    result = breakout["verdict"]["results"][name]
    assert result["refused"], f"{breakout['route']}: {name} succeeded: {result['detail']}"


def test_nothing_escaped_to_the_host(breakout: dict[str, Any]) -> None:
    data_dir: Path = breakout["data_dir"]
    assert not (data_dir / "escaped").exists()
    assert not Path("/usr/escaped").exists()
    assert not Path("/escaped").exists()
    assert not breakout["listener"].accepted.is_set()


def test_runs_as_an_unprivileged_host_uid(breakout: dict[str, Any]) -> None:
    assert breakout["verdict"]["uid"] != 0
    assert breakout["verdict"]["gid"] != 0
    # The uid is real on the host too: files the sandbox creates are not root's.
    assert breakout["created_owner"] == breakout["verdict"]["uid"]


@pytest.mark.parametrize("route", ROUTES)
def test_fork_bomb_is_contained_by_the_pids_limit(tmp_path: Path, route: str) -> None:
    require_isolation()
    limits = SandboxLimits(memory_bytes=256 * 1024 * 1024, pids=32, cpu_cores=1.0)
    with started_launcher(tmp_path, route) as launcher:
        paths = launcher.prepare("bomb")
        proc = launcher.launch(program_spec(paths, "bomb", "forkbomb.py", limits=limits))
        from tests.fixtures.sandboxes import wait_for

        log_file = paths.logs / "sandbox.log"
        wait_for(lambda: log_file.exists() and b"forked" in log_file.read_bytes(), 60, "the fork bomb to report")
        report = json.loads(log_file.read_text().strip().splitlines()[-1])
        proc.kill()
        proc.wait(30)
        proc.cleanup()
    assert report["refused"], report
    assert report["forked"] < limits.pids


@pytest.mark.parametrize("route", ROUTES)
def test_allocating_past_the_memory_limit_is_reported_as_out_of_memory(tmp_path: Path, route: str) -> None:
    require_isolation()
    limits = SandboxLimits(memory_bytes=96 * 1024 * 1024, pids=32, cpu_cores=1.0)
    with started_launcher(tmp_path, route) as launcher:
        paths = launcher.prepare("hog")
        spec: SandboxSpec = program_spec(paths, "hog", "memhog.py", "1024", limits=limits)
        proc = launcher.launch(spec)
        info = proc.wait(60)
        proc.cleanup()
        log = (paths.logs / "sandbox.log").read_text()  # on the sandbox's disk: read before stop unmounts it
    assert info.reason is ExitReason.OUT_OF_MEMORY, (info, log)
    assert "did not hold" not in log
    assert "memory limit of 96 MiB" in info.describe()
