"""POST /api/sessions/{id}/fork through a real server, real sandboxes and the fake model: the fork
starts with the parent's workspace and conversation, then the two go their own ways."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _exec(api: Api, sid: str, command: str) -> str:
    status, body = await api.call("POST", f"/api/sessions/{sid}/exec", json={"command": command})
    assert status == 200, body
    return str(body["stdout"])


async def _lifecycle(api: Api, sid: str) -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
    assert status == 200, body
    return [json.loads(e["data"]) for e in body["events"]]


async def _fork(api: Api, sid: str) -> dict[str, Any]:
    status, body = await api.call("POST", f"/api/sessions/{sid}/fork")
    assert status == 201, body
    return dict(body["session"])


@pytest.mark.parametrize("parent_state", ["live", "stopped"])
async def test_a_fork_has_the_workspace_and_the_conversation_then_its_own_life(
        sapi: Api, fake_model: FakeModel, parent_state: str) -> None:  # noqa: F811
    await deploy(sapi)
    parent = (await create(sapi, extraEnv={"FORK_SECRET": "s3"}))["id"]
    fake_model.script("remember-parrot", [{"content": [{"type": "text", "text": "noted: parrot"}]}])
    status, _ = await send(sapi, parent, "remember-parrot")
    assert status == 200
    await _exec(sapi, parent, "echo from-parent > shared.txt")
    if parent_state == "stopped":
        status, _ = await sapi.call("POST", f"/api/sessions/{parent}/stop")
        assert status == 200

    child = await _fork(sapi, parent)
    assert child["status"] == "active" and child["parentSessionId"] == parent and child["id"] != parent
    assert await _exec(sapi, child["id"], "cat shared.txt; echo $FORK_SECRET") == "from-parent\ns3\n"
    status, body = await sapi.call("GET", f"/api/sessions/{child['id']}/messages")
    assert status == 200 and [m["role"] for m in body["messages"]][:2] == ["user", "assistant"]

    # The child's model sees the parent's conversation; the two diverge from here.
    fake_model.script("child-turn", [{"content": [{"type": "text", "text": "child reply"}]}])
    status, frames = await send(sapi, child["id"], "child-turn")
    assert status == 200 and frames[-1].event == "done"
    request = fake_model.requests_containing("child-turn")[-1]["body"]
    assert "remember-parrot" in json.dumps(request["messages"]) and "noted: parrot" in json.dumps(request["messages"])
    await _exec(sapi, child["id"], "echo from-child > shared.txt")
    if parent_state == "live":
        assert await _exec(sapi, parent, "cat shared.txt") == "from-parent\n"
    status, body = await sapi.call("GET", f"/api/sessions/{parent}/messages")
    assert "child-turn" not in json.dumps(body["messages"])

    parent_status = "active" if parent_state == "live" else "stopped"
    assert {"action": "forked", "status": parent_status, "childSessionId": child["id"]} in await _lifecycle(
        sapi, parent)
    forked = [e for e in await _lifecycle(sapi, child["id"]) if e["action"] == "forked"]
    assert forked == [{"action": "forked", "status": "active", "parentSessionId": parent}]


async def test_fork_errors(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    parent = (await create(sapi))["id"]
    other = await sapi.new_tenant_key("fork-other")
    status, body = await sapi.call("POST", f"/api/sessions/{parent}/fork", key=other)
    assert status == 404, body
    status, body = await sapi.call("POST", "/api/sessions/00000000-0000-0000-0000-000000000000/fork")
    assert status == 404, body
    status, _ = await sapi.call("DELETE", "/api/agents/helper")
    assert status == 200
    status, body = await sapi.call("POST", f"/api/sessions/{parent}/fork")
    assert status == 404 and "helper" in body["error"], body
    status, body = await sapi.call("GET", "/api/sessions")
    assert [s["id"] for s in body["sessions"]] == [parent], "a refused fork leaves no session behind"
