"""The agent runtime through HTTP: a real server, real sandboxes, the real bridge and engine, a
scripted fake model. Covers tools, MCP, skills, permissions, subagents, model errors, usage and a
cold resume that continues the conversation."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.sse import Frame, parse_frames

pytestmark = pytest.mark.sandbox
MCP_SOURCE = (Path(__file__).resolve().parent.parent / "fixtures" / "mcp_echo_server.py").read_text()


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


@pytest.fixture(params=["zygote", "bwrap"])
async def runtime(
    request: pytest.FixtureRequest, aiohttp_client: Any, settings: Settings, fake_model: FakeModel
) -> AsyncIterator[Api]:
    """Both launch routes: the engine, MCP servers and skills run under each route's seccomp filter."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=request.param == "zygote", prewarm=1, anthropic_base_url=fake_model.url,
        anthropic_api_key="sk-ant-runtime"))
    files = [
        {"path": "AGENT.md", "content": "You are the runtime test agent."},
        {"path": ".agent/skills/greet.md", "content": "SKILL-E2E: greet $ARGUMENTS warmly"},
        {"path": "mcp_echo.py", "content": MCP_SOURCE},
        {"path": ".mcp.json", "content": json.dumps(
            {"mcpServers": {"echo": {"command": sys.executable, "args": ["/workspace/mcp_echo.py"]}}})},
        {"path": "notes.txt", "content": "alpha\nbeta\n"},
    ]
    status, body = await api.call("POST", "/api/agents", json={"name": "runtime", "files": files})
    assert status == 201, body
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def turn(api: Api, sid: str, content: str) -> list[Frame]:
    resp = await api.client.post(f"/api/sessions/{sid}/messages", json={"content": content}, headers=api.headers())
    assert resp.status == 200, await resp.text()
    frames = parse_frames(await resp.text())
    assert frames[-1].event == "done" and [f.event for f in frames].count("done") == 1
    return frames


def tool_results(frames: list[Frame]) -> list[dict[str, Any]]:
    return [b for f in frames if f.event == "message" and f.data["type"] == "user"
            for b in f.data["message"]["content"] if b["type"] == "tool_result"]


def result(frames: list[Frame]) -> dict[str, Any]:
    return next(f.data for f in frames if f.event == "message" and f.data["type"] == "result")


def block_text(block: dict[str, Any]) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


async def new_session(api: Api, **body: Any) -> str:
    status, created = await api.call("POST", "/api/sessions", json={"agent": "runtime", **body})
    assert status == 201, created
    return str(created["session"]["id"])


async def test_tools_mcp_skill_usage_and_cold_resume(runtime: Api, fake_model: FakeModel) -> None:
    api = runtime
    sid = await new_session(api, extraEnv={"SESSION_VAR": "from-session"})
    fake_model.script("E2E-FILES", [
        {"content": [text("writing"), tool("Write", file_path="out/new.txt", content="one two")]},
        {"content": [tool("Edit", file_path="out/new.txt", old_string="two", new_string="three")]},
        {"content": [tool("Read", file_path="notes.txt")]},
        {"content": [tool("Bash", command='echo "$SESSION_VAR" > bash.txt')]},
        {"content": [text("files done")]},
    ])
    frames = await turn(api, sid, "E2E-FILES please")
    assert not any(r.get("is_error") for r in tool_results(frames))
    assert "alpha" in block_text(tool_results(frames)[2])
    status, body = await api.call("GET", f"/api/sessions/{sid}/files/out/new.txt?format=json")
    assert status == 200 and body["content"] == "one three" and body["source"] == "sandbox"
    status, body = await api.call("GET", f"/api/sessions/{sid}/files/bash.txt?format=json")
    assert body["content"] == "from-session\n"

    fake_model.script("E2E-MCP", [{"content": [tool("mcp__echo__echo", text="ping")]}, {"content": [text("mcp ok")]}])
    frames = await turn(api, sid, "E2E-MCP go")
    assert block_text(tool_results(frames)[0]) == "mcp-echo: ping"

    frames = await turn(api, sid, "/greet Bob")
    assert result(frames)["result"] == "echo: SKILL-E2E: greet Bob warmly"

    status, body = await api.call("GET", f"/api/usage/stats?sessionId={sid}")
    stats = body["stats"]
    assert stats["totalMessages"] == 3
    assert stats["totalToolCalls"] == 5  # Write, Edit, Read, Bash, mcp__echo__echo
    assert stats["totalInputTokens"] > 0 and stats["totalOutputTokens"] > 0
    assert stats["totalComputeSeconds"] > 0

    # A cold resume (new sandbox, workspace from the snapshot, history from the database) continues.
    assert (await api.call("POST", f"/api/sessions/{sid}/stop"))[0] == 200
    status, body = await api.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    await turn(api, sid, "E2E-AFTER-RESUME what did I ask first?")
    request = fake_model.requests_containing("E2E-AFTER-RESUME")[0]["body"]
    conversation = str(request["messages"])
    assert "E2E-FILES please" in conversation and "mcp-echo: ping" in conversation
    status, body = await api.call("GET", f"/api/sessions/{sid}/files/out/new.txt?format=json")
    assert body["content"] == "one three"


async def test_permissions_subagents_and_model_errors(runtime: Api, fake_model: FakeModel) -> None:
    api = runtime
    sid = await new_session(
        api, disallowedTools=["Bash"],
        subagents={"researcher": {"description": "reads", "prompt": "You research.", "tools": ["Read"]}})
    fake_model.script("E2E-DENY", [{"content": [tool("Bash", command="touch nope")]}, {"content": [text("ok")]}])
    frames = await turn(api, sid, "E2E-DENY try")
    refused = tool_results(frames)[0]
    assert refused["is_error"] is True and "refused" in block_text(refused)
    status, _ = await api.call("GET", f"/api/sessions/{sid}/files/nope?format=json")
    assert status == 404

    fake_model.script("E2E-MAIN", [
        {"content": [tool("Task", description="look", prompt="E2E-SUB read it", subagent_type="researcher")]},
        {"content": [text("main done")]},
    ])
    fake_model.script("E2E-SUB", [{"content": [tool("Read", file_path="notes.txt")]}, {"content": [text("sub answer")]}])
    frames = await turn(api, sid, "E2E-MAIN")
    assert block_text(tool_results(frames)[-1]) == "sub answer"
    assert result(frames)["result"] == "main done"

    fake_model.script("E2E-AUTH", [{"error": {"status": 401, "message": "invalid x-api-key"}}])
    frames = await turn(api, sid, "E2E-AUTH")
    errors = [f for f in frames if f.event == "error"]
    assert len(errors) == 1 and "401" in errors[0].data["error"]
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=error")
    assert any("401" in e["data"] for e in body["events"])
