"""POST /api/sessions/{id}/exec through a real server and real sandboxes: the command runs inside the
session's sandbox (its workspace, its uid, no view of the host), not through the model."""

from __future__ import annotations

from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _exec(api: Api, sid: str, command: str, **extra: object) -> tuple[int, dict[str, Any]]:
    status, body = await api.call("POST", f"/api/sessions/{sid}/exec", json={"command": command, **extra})
    return status, body


async def test_exec_runs_in_the_sessions_workspace_and_its_files_are_the_sessions(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await _exec(sapi, sid, "pwd; echo made by exec > made.txt; echo oops >&2; exit 3")
    assert status == 200, body
    assert body == {"exitCode": 3, "stdout": "/workspace\n", "stderr": "oops\n"}
    status, files = await sapi.call("GET", f"/api/sessions/{sid}/files/made.txt?format=json")
    assert status == 200 and files["content"] == "made by exec\n"
    assert not fake_model.requests, "exec must not go through the model"


async def test_exec_is_as_confined_as_the_agents_own_commands(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    services = sapi.server.components
    assert services is not None
    data_dir = services.settings.data_dir
    status, body = await _exec(sapi, sid, f"id -u; test -e {data_dir} && echo SEES-DATA-DIR; "
                                          "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 5432), 1)' "
                                          "2>/dev/null && echo REACHED-POSTGRES; true")
    assert status == 200, body
    lines = str(body["stdout"]).split()
    assert lines[0] != "0", "exec runs as the sandbox's unprivileged user"
    assert "SEES-DATA-DIR" not in lines and "REACHED-POSTGRES" not in lines


async def test_exec_output_is_capped_and_a_timeout_kills_the_command(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await _exec(sapi, sid, "head -c 3000000 /dev/zero | tr '\\0' a")
    assert status == 200
    stdout = str(body["stdout"])
    assert stdout.startswith("a" * 1000) and "truncated" in stdout and len(stdout) < 1024 * 1024 + 200
    status, body = await _exec(sapi, sid, "sleep 60 & sleep 60; echo never", timeout=300)
    assert status == 200, body
    assert body["timedOut"] is True and "never" not in str(body["stdout"])
    status, body = await _exec(sapi, sid, "pgrep -c sleep || true")
    assert status == 200 and str(body["stdout"]).strip() == "0", "the whole process group was killed"


async def test_exec_errors(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/exec", json={})
    assert status == 400 and body["error"] == "`command` is required"
    for bad in (0, -5, 600_001, "10", True):
        status, body = await _exec(sapi, sid, "true", timeout=bad)
        assert status == 400 and "`timeout`" in body["error"], (bad, body)
    other = await sapi.new_tenant_key("other-tenant")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/exec", json={"command": "true"}, key=other)
    assert status == 404, body
    status, body = await _exec(sapi, "00000000-0000-0000-0000-000000000000", "true")
    assert status == 404, body
    status, _ = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200
    status, body = await _exec(sapi, sid, "true")
    assert status == 400 and body["error"] == "Session is paused; resume it before running commands"
    status, _ = await sapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200
    status, body = await _exec(sapi, sid, "true")
    assert status == 400 and body["error"] == "Session is ended; create a new session"
