# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""Engine features through the server: a compaction is stored with the session and a cold resume
hands the bridge the compacted conversation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ashd.bridge.engine._compact import SUMMARY_HEADER, SUMMARY_INSTRUCTION
from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, send

WINDOW = 20_000


@pytest.fixture
async def wapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        model_context_window=WINDOW))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


def print_chars(char: str, count: int = 20_000) -> dict[str, Any]:
    command = f"python3 -c \"print('{char}' * {count})\""
    return {"type": "tool_use", "name": "Bash", "input": {"command": command}}


def first_text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else content[0]["text"]


async def test_compaction_is_stored_and_a_cold_resume_gets_the_compacted_view(wapi: Api, fake_model: FakeModel) -> None:
    fake_model.script(SUMMARY_INSTRUCTION[:60], [{"content": [{"type": "text", "text": "SUMMARY-SRV: printed a"}]}])
    fake_model.script("SRV-OVF", [{"content": [print_chars("a")]}, {"content": [print_chars("b")]},
                                  {"content": [{"type": "text", "text": "server overflow done"}]}], sequential=True)
    await deploy(wapi)
    # An unknown model: the window is SERVICE_MODEL_CONTEXT_WINDOW.
    sid = (await create(wapi, model="claude-fake-model"))["id"]
    status, frames = await send(wapi, sid, "SRV-OVF print twice")
    assert status == 200 and frames[-1].event == "done"
    assert [f.data["result"] for f in frames if f.event == "message" and f.data["type"] == "result"] == [
        "server overflow done"]

    status, body = await wapi.call("GET", f"/api/sessions/{sid}/events?type=compaction")
    assert status == 200, body
    [event] = body["events"]
    data = json.loads(event["data"])
    assert data["trigger"] == "auto" and data["keptMessages"] == 2 and data["summarisedMessages"] == 3
    assert data["summary"].startswith(SUMMARY_HEADER.format(count=3))
    # ashd's own event type is left out of the unfiltered list (the reference's clients reject it)
    status, body = await wapi.call("GET", f"/api/sessions/{sid}/events?limit=1000")
    types = {e["type"] for e in body["events"]}
    assert status == 200 and "compaction" not in types and {"tool_start", "turn_complete"} <= types
    # The stored messages stay complete: every model turn and tool result, and the compaction record.
    _, body = await wapi.call("GET", f"/api/sessions/{sid}/messages")
    contents = [json.loads(m["content"]) for m in body["messages"]]
    assert sum(1 for c in contents if c.get("type") == "assistant") == 3
    assert sum(1 for c in contents if c.get("type") == "user" and "message" in c) == 2
    assert any("a" * 20_000 in json.dumps(c) for c in contents)
    assert sum(1 for c in contents if c.get("subtype") == "compact_boundary") == 1

    status, body = await wapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200, body
    status, body = await wapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200, body
    status, frames = await send(wapi, sid, "SRV-AFTER resumed")
    assert status == 200 and frames[-1].event == "done"
    resumed = fake_model.requests_containing("SRV-AFTER resumed")[0]["body"]["messages"]
    assert first_text(resumed[0]) == data["summary"]
    assert [m["role"] for m in resumed] == ["user", "assistant", "user", "assistant", "user"]
    assert "b" * 20_000 in json.dumps(resumed[2])


async def deploy_files(api: Api, name: str, settings: dict[str, Any]) -> tuple[int, Any]:
    files = [{"path": "AGENT.md", "content": "You are the engine tester."},
             {"path": ".agent/settings.json", "content": json.dumps(settings)}]
    return await api.call("POST", "/api/agents", json={"name": name, "files": files})


async def test_an_unknown_engine_is_refused_at_deploy(wapi: Api) -> None:
    status, body = await deploy_files(wapi, "no-engine", {"engine": "gpt-engine"})
    assert status == 400, body
    assert body["statusCode"] == 400
    assert "unknown engine 'gpt-engine'" in body["error"] and "builtin, claude-agent-sdk" in body["error"]
    status, _ = await wapi.call("GET", "/api/agents/no-engine")
    assert status == 404


async def test_the_claude_agent_sdk_engine_runs_in_a_sandbox(wapi: Api, fake_model: FakeModel) -> None:
    status, body = await deploy_files(wapi, "sdk-agent", {"engine": "claude-agent-sdk"})
    assert status == 201, body
    fake_model.script("SRV-SDK", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo in-sandbox > /workspace/sdk.txt"}}]},
        {"content": [{"type": "text", "text": "sdk engine done"}]}])
    sid = (await create(wapi, agent="sdk-agent"))["id"]
    status, frames = await send(wapi, sid, "SRV-SDK go")
    assert status == 200 and frames[-1].event == "done", frames
    messages = [f.data for f in frames if f.event == "message"]
    assert messages[-1]["type"] == "result" and messages[-1]["result"] == "sdk engine done"
    status, body = await wapi.call("GET", f"/api/sessions/{sid}/files/sdk.txt")
    assert status == 200 and "in-sandbox" in json.dumps(body)
    # No key in the sandbox: the CLI sent a placeholder, the model proxy put the session's key in its place.
    sent = fake_model.requests_containing("SRV-SDK go")
    assert sent and {r["headers"].get("x-api-key") for r in sent} == {"sk-ant-test-server-key"}
    assert "You are the engine tester." in json.dumps(sent[0]["body"]["system"])
