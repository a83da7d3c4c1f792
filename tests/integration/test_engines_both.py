# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""The same end-to-end engine tests for both engines (`builtin` and `claude-agent-sdk`): a real
bridge process, the model proxy and the fake model. Assertions are about what an agent author
sees (the workspace, the messages, the requests the model got), not about one engine's wording."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ashd.bridge.engine._model import MAX_RETRIES
from ashd.bridge.history import history_from_stored
from ashd.devtools.fake_model import FakeModel
from ashd.engines import bundled_cli
from ashd.model_names import LONG_CONTEXT_BETA
from tests.fixtures.bridge_fixture import BridgeHarness, bridge, collect, messages_of  # noqa: F401
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401

MCP_SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp_echo_server.py"
ENGINES = ["builtin", "claude-agent-sdk"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    if name == "claude-agent-sdk":
        # Installed with the dev extra: a missing CLI is a broken install, not a reason to skip.
        assert bundled_cli() is not None, "claude-agent-sdk (with its bundled CLI) is not installed"
    return name


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def result_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    results = [m for m in messages_of(frames) if m["type"] == "result"]
    assert len(results) == 1, messages_of(frames)
    return results[0]


def tool_results(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for m in messages_of(frames) if m["type"] == "user" and isinstance(m["message"]["content"], list)
            for b in m["message"]["content"] if b.get("type") == "tool_result"]


def offered_tools(fake: FakeModel, token: str) -> set[str]:
    return {t["name"] for t in fake.requests_containing(token)[0]["body"].get("tools") or []}


async def test_tools_change_the_workspace(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    target = bridge.workspace / "out.txt"
    fake_model.script("BOTH-TOOLS", [
        {"content": [tool("Write", file_path=str(target), content="one two")]},
        {"content": [tool("Bash", command=f'echo "$SESSION_VAR" >> {target}')]},
        {"content": [text("tools done")]},
    ])
    conn = await bridge.init({"engine": engine, "env": {"SESSION_VAR": "from-session"}})
    frames = await collect(conn, "BOTH-TOOLS go")
    assert target.read_text() == "one twofrom-session\n"
    res = result_of(frames)
    assert (res["subtype"], res["result"], res["is_error"]) == ("success", "tools done", False)
    assert len(tool_results(frames)) == 2
    assert not any(r.get("is_error") for r in tool_results(frames))


async def test_mcp_server_tool(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    mcp = {"mcpServers": {"echo": {"command": sys.executable, "args": [str(MCP_SERVER)]}}}
    (bridge.workspace / ".mcp.json").write_text(json.dumps(mcp))
    fake_model.script("BOTH-MCP", [{"content": [tool("mcp__echo__echo", text="ping")]}, {"content": [text("mcp ok")]}])
    conn = await bridge.connect()
    init_ok = await conn.init({"engine": engine}, timeout=90)
    # Neither engine's `init` waits for the server; the first query does, before its prompt goes.
    assert init_ok["mcpServers"] == [{"name": "echo", "status": "pending"}]
    frames = await collect(conn, "BOTH-MCP go")
    assert "mcp-echo: ping" in json.dumps(tool_results(frames)[0])
    assert result_of(frames)["result"] == "mcp ok"
    # Offered to the model: as a tool, or (Claude Code) in its list of deferred tools.
    assert "mcp__echo__echo" in json.dumps(fake_model.requests_containing("BOTH-MCP")[0]["body"])


async def test_a_slow_mcp_server_holds_up_the_first_query_not_init(engine: str, bridge: BridgeHarness,
                                                                    fake_model: FakeModel) -> None:
    # The echo server, started 3 s after its process (an `npx` server fetching itself, say).
    slow = {"command": "sh", "args": ["-c", 'sleep 3; exec "$0" "$1"', sys.executable, str(MCP_SERVER)]}
    (bridge.workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"slow": slow}}))
    fake_model.script("BOTH-SLOW-MCP", [{"content": [tool("mcp__slow__add", a=2, b=40)]}, {"content": [text("ok")]}])
    conn = await bridge.connect()
    init_ok = await conn.init({"engine": engine}, timeout=90)
    assert init_ok["mcpServers"] == [{"name": "slow", "status": "pending"}]
    frames = await collect(conn, "BOTH-SLOW-MCP go")
    assert "42" in json.dumps(tool_results(frames)[0])
    assert "mcp__slow__add" in json.dumps(fake_model.requests_containing("BOTH-SLOW-MCP")[0]["body"])


async def test_skill_expands(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    skills = bridge.workspace / ".agent" / "skills"
    skills.mkdir(parents=True)
    (skills / "greet.md").write_text("BOTH-SKILL: greet $ARGUMENTS warmly")
    conn = await bridge.init({"engine": engine})
    frames = await collect(conn, "/greet Bob")
    assert "BOTH-SKILL: greet Bob warmly" in result_of(frames)["result"]


async def test_disallowed_tool_is_not_offered_nor_run(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-DENY", [{"content": [tool("Bash", command="touch should-not-exist")]},
                                    {"content": [text("ok")]}])
    conn = await bridge.init({"engine": engine, "disallowedTools": ["Bash"]})
    frames = await collect(conn, "BOTH-DENY try")
    assert not (bridge.workspace / "should-not-exist").exists()
    assert tool_results(frames)[0].get("is_error") is True
    offered = offered_tools(fake_model, "BOTH-DENY")
    assert "Bash" not in offered and "Read" in offered


async def test_settings_permissions_deny(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    agent_dir = bridge.workspace / ".agent"
    agent_dir.mkdir()
    (agent_dir / "settings.json").write_text(json.dumps({"permissions": {"deny": ["Bash(touch *)"]}}))
    fake_model.script("BOTH-PERM", [{"content": [tool("Bash", command="touch denied.txt")]},
                                    {"content": [tool("Bash", command="echo fine > allowed.txt")]},
                                    {"content": [text("perm done")]}])
    conn = await bridge.init({"engine": engine})
    frames = await collect(conn, "BOTH-PERM go")
    assert not (bridge.workspace / "denied.txt").exists()
    assert (bridge.workspace / "allowed.txt").read_text() == "fine\n"
    results = tool_results(frames)
    assert results[0].get("is_error") is True and not results[1].get("is_error")


async def test_model_error_is_an_error_result(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-AUTH", [{"error": {"status": 401, "message": "invalid x-api-key"}}])
    conn = await bridge.init({"engine": engine})
    frames = await collect(conn, "BOTH-AUTH")
    assert [f["type"] for f in frames][-2:] == ["error", "done"]
    assert result_of(frames)["is_error"] is True
    # Both engines keep the same retry budget (the CLI's own is 10 tries, three minutes of backoff).
    assert 1 <= len(fake_model.requests_containing("BOTH-AUTH")) <= MAX_RETRIES + 1


async def test_usage_and_cost(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-USAGE", [{"content": [tool("Bash", command="true")]}, {"content": [text("counted")]}])
    conn = await bridge.init({"engine": engine, "model": "claude-sonnet-4-5"})
    res = result_of(await collect(conn, "BOTH-USAGE"))
    usage = res["usage"]
    assert usage["output_tokens"] > 0
    assert usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"] > 0
    assert usage["cache_read_input_tokens"] > 0  # the second call read what the first wrote
    assert res["total_cost_usd"] > 0


async def test_cold_resume_with_the_stored_history(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    stored: list[dict[str, Any]] = [
        {"type": "user", "content": "BOTH-HIST first question"},
        {"type": "assistant", "message": {"id": "m1", "role": "assistant", "content": [text("first answer")]}},
        {"type": "result", "subtype": "success"},
    ]
    conn = await bridge.init({"engine": engine, "history": history_from_stored(stored)})
    frames = await collect(conn, "BOTH-HIST second question")
    assert result_of(frames)["subtype"] == "success"
    body = json.dumps(fake_model.requests_containing("second question")[0]["body"]["messages"])
    assert body.index("BOTH-HIST first question") < body.index("first answer") < body.index("second question")
    # and the bridge keeps the conversation between queries
    await collect(conn, "BOTH-HIST third")
    body = json.dumps(fake_model.requests_containing("BOTH-HIST third")[0]["body"]["messages"])
    assert body.index("first answer") < body.index("second question") < body.index("BOTH-HIST third")


async def test_interrupt_then_go_on(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-INTR", [{"content": [tool("Bash", command="sleep 60")]}])
    conn = await bridge.init({"engine": engine})
    seen: list[dict[str, Any]] = []
    async for frame in conn.query("BOTH-INTR go", query_id="q-both-intr"):
        seen.append(frame)
        if frame["type"] == "message" and frame["data"]["type"] == "assistant":
            await conn.interrupt("q-both-intr")
    assert [f["type"] for f in seen[-2:]] == ["error", "done"]
    assert seen[-2]["error"] == "interrupted"
    # The conversation stays usable, and the next turn is answered on its own.
    again = await collect(conn, "BOTH-AFTER next")
    res = result_of(again)
    assert res["subtype"] == "success" and "BOTH-AFTER next" in res["result"]


async def test_partial_messages_only_when_asked(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    conn = await bridge.init({"engine": engine})
    plain = messages_of(await collect(conn, "BOTH-PART one"))
    partial = messages_of(await collect(conn, "BOTH-PART two", include_partial_messages=True))
    assert not [m for m in plain if m["type"] == "stream_event"]
    deltas = [m["event"] for m in partial if m["type"] == "stream_event" and m["event"]["type"] == "content_block_delta"]
    assert "".join(d["delta"].get("text", "") for d in deltas) == result_of(
        [{"type": "message", "data": m} for m in partial])["result"]


async def test_initial_agent_prompt_and_subagents(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    subagents = {"writer": {"description": "writes files", "prompt": "BOTH-WRITER-PROMPT: you write.",
                            "tools": ["Write", "Read"]}}
    conn = await bridge.init({"engine": engine, "subagents": subagents, "initialAgent": "writer"})
    await collect(conn, "BOTH-AGENT hello")
    body = fake_model.requests_containing("BOTH-AGENT hello")[0]["body"]
    assert "BOTH-WRITER-PROMPT: you write." in json.dumps(body["system"])


async def test_message_options_reach_the_model(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-OPTS", [{"content": [text("considered")]}])
    conn = await bridge.init({"engine": engine, "model": "claude-opus-4-5"})
    frames = await collect(conn, "BOTH-OPTS go", effort="high", thinking={"type": "enabled", "budget_tokens": 3000})
    assert result_of(frames)["subtype"] == "success"
    body = fake_model.requests_containing("BOTH-OPTS")[-1]["body"]
    assert body["thinking"]["type"] == "enabled" and body["thinking"]["budget_tokens"] == 3000
    assert body["max_tokens"] > 3000
    assert body["output_config"]["effort"] == "high"


async def test_max_turns_of_a_message(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("BOTH-MAXT", [{"content": [tool("Bash", command="true")]}] * 6)
    conn = await bridge.init({"engine": engine})
    res = result_of(await collect(conn, "BOTH-MAXT go", maxTurns=2))
    assert (res["subtype"], res["is_error"]) == ("error_max_turns", True)
    # the next message has the session's own limit again
    fake_model.script("BOTH-AFTER", [{"content": [tool("Bash", command="true")]}] * 3 + [{"content": [text("ok")]}])
    res = result_of(await collect(conn, "BOTH-AFTER go"))
    assert res["subtype"] == "success"


async def test_output_format_structured_result(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fake_model.script("BOTH-JSON", [{"content": [tool("StructuredOutput", city="Oslo")]}, {"content": [text("done")]}])
    conn = await bridge.init({"engine": engine})
    res = result_of(await collect(conn, "BOTH-JSON capital?", outputFormat={"type": "json_schema", "schema": schema}))
    assert res["subtype"] == "success" and res["structured_output"] == {"city": "Oslo"}
    assert "StructuredOutput" in offered_tools(fake_model, "BOTH-JSON")


async def test_live_config_switches_the_model(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    conn = await bridge.init({"engine": engine, "model": "claude-sonnet-4-5"})
    await collect(conn, "BOTH-CFG-A hi")
    await collect(conn, "BOTH-CFG-B hi", config={"model": "claude-opus-4-5", "betas": [LONG_CONTEXT_BETA]})
    before = [r for r in fake_model.requests_containing("BOTH-CFG-A") if "BOTH-CFG-B" not in str(r["body"])]
    after = fake_model.requests_containing("BOTH-CFG-B")
    assert {r["body"]["model"] for r in before} == {"claude-sonnet-4-5"}
    assert {r["body"]["model"] for r in after} == {"claude-opus-4-5"}
    # (the CLI takes only the betas it knows: this one it does)
    assert all(LONG_CONTEXT_BETA in r["headers"]["anthropic-beta"] for r in after)
