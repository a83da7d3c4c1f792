"""What agents build and run keeps working under the seccomp filter, on both launch routes:
Python (threads, subprocess, multiprocessing, sqlite, ssl), Node (child processes, worker threads),
`npm install` (offline, a file: dependency), git, a C compiler, bash pipelines, a setup script.
The engine, MCP and setup through the bridge are covered by tests/e2e and test_pool_http.py,
which also run in real sandboxes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ashd.sandboxing import ExitReason, SandboxSpec
from tests.fixtures.sandboxes import FIXTURES, ROUTES, require_isolation, started_launcher

pytestmark = pytest.mark.sandbox
STEPS = ["python", "node", "npm_install", "git", "gcc", "bash_pipeline", "setup_sh"]
TOOLS = ("node", "npm", "git", "gcc", "bash")


@pytest.mark.parametrize("route", ROUTES)
def test_agent_workloads_run_under_the_filter(tmp_path: Path, route: str) -> None:
    require_isolation()
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"the host lacks {missing}: agents could not use them either"
    with started_launcher(tmp_path, route) as launcher:
        paths = launcher.prepare("work")
        shutil.copy(FIXTURES / "workloads.sh", paths.workspace / "workloads.sh")
        spec = SandboxSpec("work", paths, env={"LANG": "C.UTF-8"}, argv=("/bin/sh", "/workspace/workloads.sh"))
        proc = launcher.launch(spec)
        info = proc.wait(300)
        proc.cleanup()
        out = (paths.logs / "sandbox.log").read_text()  # on the sandbox's disk: read before stop unmounts it
    assert info.reason is ExitReason.NORMAL and "workloads done" in out, out
    results = {line.split()[1].rstrip(":"): line for line in out.splitlines() if line.startswith(("ok ", "FAIL "))}
    for step in STEPS:
        assert results.get(step, "").startswith("ok "), results.get(step, f"{step} did not run:\n{out}")
