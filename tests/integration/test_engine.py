# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""The agent engine end to end: real bridge process → anthropic SDK → ModelProxy → fake model."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

from ashd.bridge.engine._compact import CURRENT_REQUEST, SUMMARY_HEADER, SUMMARY_INSTRUCTION
from ashd.bridge.history import history_from_stored
from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing._bridge_client import BridgeConnection
from tests.fixtures.bridge_fixture import TEST_API_KEY, BridgeHarness, bridge, collect, messages_of  # noqa: F401
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401

MCP_SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp_echo_server.py"


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_results(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        block
        for m in messages_of(frames)
        if m["type"] == "user"
        for block in m["message"]["content"]
        if block["type"] == "tool_result"
    ]


def result_of(frames: list[dict[str, Any]]) -> dict[str, Any]:
    results = [m for m in messages_of(frames) if m["type"] == "result"]
    assert len(results) == 1
    return results[0]


def system_text(body: dict[str, Any]) -> str:
    """The system prompt of a request (sent as blocks, to carry a cache breakpoint)."""
    system = body["system"]
    return system if isinstance(system, str) else "".join(b["text"] for b in system)


def marked(body: dict[str, Any]) -> list[str]:
    """Where a request's cache breakpoints are: `tool:<name>`, `system`, `message:<index>`."""
    out = [f"tool:{t['name']}" for t in body.get("tools") or [] if "cache_control" in t]
    system = body.get("system")
    out += ["system" for b in (system if isinstance(system, list) else []) if "cache_control" in b]
    for i, msg in enumerate(body["messages"]):
        content = msg["content"]
        out += [f"message:{i}" for b in (content if isinstance(content, list) else []) if "cache_control" in b]
    return out


def block_text(block: dict[str, Any]) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


async def test_file_tools_and_bash_change_the_workspace(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    (bridge.workspace / "notes.txt").write_text("alpha\nbeta\n")
    fake_model.script(
        "FILES-1",
        [
            {"content": [text("writing"), tool("Write", file_path="out/new.txt", content="one two")]},
            {"content": [tool("Edit", file_path="out/new.txt", old_string="two", new_string="three")]},
            {"content": [tool("Read", file_path=str(bridge.workspace / "notes.txt"))]},
            {"content": [tool("Bash", command='echo "$SESSION_VAR" > bash.txt && cat out/new.txt')]},
            {
                "content": [
                    tool("Grep", pattern="^be", output_mode="content"),
                    tool("Glob", pattern="**/*.txt"),
                ]
            },
            {"content": [text("all done")]},
        ],
    )
    conn = await bridge.init({"env": {"SESSION_VAR": "from-session"}})
    frames = await collect(conn, "FILES-1 please")
    assert (bridge.workspace / "out" / "new.txt").read_text() == "one three"
    assert (bridge.workspace / "bash.txt").read_text() == "from-session\n"
    results = tool_results(frames)
    assert not any(r.get("is_error") for r in results)
    assert "     1\talpha" in block_text(results[2])
    assert block_text(results[3]) == "one three"
    assert "notes.txt:2:beta" in block_text(results[4])
    assert "bash.txt" in block_text(results[5])
    res = result_of(frames)
    assert res["subtype"] == "success"
    assert res["result"] == "all done"
    assert res["num_turns"] == 6
    assert res["tool_calls"] == 6


async def test_mcp_stdio_server_tool_is_called(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    mcp = {"mcpServers": {"echo": {"command": sys.executable, "args": [str(MCP_SERVER)]}}}
    (bridge.workspace / ".mcp.json").write_text(json.dumps(mcp))
    fake_model.script("MCP-1", [{"content": [tool("mcp__echo__echo", text="ping")]}, {"content": [text("mcp ok")]}])
    conn = await bridge.connect()
    init_ok = await conn.init({}, timeout=60)
    # `init` answers while the server starts (a process and its handshake); the first query waits
    # for it, and its first model call offers the server's tools (below).
    assert init_ok["mcpServers"] == [{"name": "echo", "status": "pending"}]
    frames = await collect(conn, "MCP-1 go")
    results = tool_results(frames)
    assert block_text(results[0]) == "mcp-echo: ping"
    offered = [t["name"] for t in fake_model.requests_containing("MCP-1")[0]["body"]["tools"]]
    assert {"mcp__echo__echo", "mcp__echo__add", "Bash", "Task"} <= set(offered)


async def test_failing_mcp_server_is_reported(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    mcp = {"mcpServers": {"broken": {"command": "/no/such/mcp-server"}}}
    (bridge.workspace / ".mcp.json").write_text(json.dumps(mcp))
    logs: list[dict[str, Any]] = []
    conn = await BridgeConnection.connect(bridge.socket, 30, on_log=logs.append)
    init_ok = await conn.init({})
    assert init_ok["mcpServers"] == [{"name": "broken", "status": "pending"}]
    # The first query waits for its start to end: reported by then, and the query goes on without it.
    frames = await collect(conn, "MCP-BROKEN go")
    assert result_of(frames)["subtype"] == "success"
    assert any(f["level"] == "error" and "broken" in f["message"] and "failed to start" in f["message"]
               for f in logs)
    offered = [t["name"] for t in fake_model.requests_containing("MCP-BROKEN")[0]["body"]["tools"]]
    assert "Bash" in offered and not any(name.startswith("mcp__") for name in offered)


def slow_mcp(delay_s: float) -> dict[str, Any]:
    """The echo server, started `delay_s` after its process (an `npx` server fetching itself, say)."""
    return {"command": "sh", "args": ["-c", f'sleep {delay_s}; exec "$0" "$1"', sys.executable, str(MCP_SERVER)]}


async def test_init_does_not_wait_for_mcp_servers_the_first_query_does(bridge: BridgeHarness,
                                                                        fake_model: FakeModel) -> None:
    (bridge.workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"slow": slow_mcp(3)}}))
    fake_model.script("MCP-SLOW", [{"content": [tool("mcp__slow__add", a=2, b=40)]}, {"content": [text("ok")]}])
    logs: list[dict[str, Any]] = []
    conn = await BridgeConnection.connect(bridge.socket, 30, on_log=logs.append)
    bridge.connections.append(conn)
    init_ok = await conn.init({})
    assert init_ok["mcpServers"] == [{"name": "slow", "status": "pending"}]
    assert not any("slow" in f["message"] for f in logs)  # neither connected nor failed yet
    frames = await collect(conn, "MCP-SLOW go")
    assert block_text(tool_results(frames)[0]) == "42"
    assert any(f["level"] == "info" and "MCP server slow: connected" in f["message"] for f in logs)
    offered = [t["name"] for t in fake_model.requests_containing("MCP-SLOW")[0]["body"]["tools"]]
    assert "mcp__slow__add" in offered


async def test_a_query_waiting_for_mcp_servers_can_be_interrupted(bridge: BridgeHarness,
                                                                  fake_model: FakeModel) -> None:
    # A server that never answers its handshake: the query would wait for its start's timeout (30 s).
    mcp = {"mcpServers": {"mute": {"command": "sleep", "args": ["600"]}}}
    (bridge.workspace / ".mcp.json").write_text(json.dumps(mcp))
    conn = await bridge.init({})
    waiting = asyncio.create_task(collect(conn, "MCP-WAIT go", query_id="q-mcp-wait", timeout=20))
    await asyncio.sleep(0.5)  # the query waits for the server by now
    assert not waiting.done()
    await conn.interrupt("q-mcp-wait", reason="stop")
    seen = await waiting
    assert [f["type"] for f in seen[-2:]] == ["error", "done"]
    assert seen[-2]["error"] == "interrupted: stop"
    assert fake_model.requests_containing("MCP-WAIT") == []  # no model call was made


def children_running(parent: int, argv0: str, arg: str) -> list[int]:
    """Live processes started by `parent` as `argv0 arg`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                status = (entry / "status").read_text()
            except OSError:
                continue
            ppid = int(status.split("PPid:")[1].split()[0])
            zombie = "State:\tZ" in status
            if ppid == parent and not zombie and cmdline[:2] == [argv0.encode(), arg.encode()]:
                found.append(int(entry.name))
    return found


async def test_servers_still_starting_are_stopped_with_their_engine(bridge: BridgeHarness) -> None:
    (bridge.workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"mute": {"command": "sleep",
                                                                                     "args": ["601"]}}}))
    conn = await bridge.init({})
    assert bridge.process is not None
    pid = bridge.process.pid
    async with asyncio.timeout(10):
        while not children_running(pid, "sleep", "601"):
            await asyncio.sleep(0.05)
    (bridge.workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {}}))
    await conn.init({})  # a new engine: the old one's server, still in its handshake, goes
    async with asyncio.timeout(15):
        while children_running(pid, "sleep", "601"):
            await asyncio.sleep(0.05)


async def test_skill_runs(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    skills = bridge.workspace / ".agent" / "skills"
    skills.mkdir(parents=True)
    (skills / "greet.md").write_text("SKILL-1: greet $ARGUMENTS warmly")
    conn = await bridge.init({})
    frames = await collect(conn, "/greet Bob")
    assert result_of(frames)["result"] == "echo: SKILL-1: greet Bob warmly"
    unknown = await collect(conn, "/nosuchskill x")
    assert result_of(unknown)["result"] == "echo: /nosuchskill x"


async def test_disallowed_tool_is_refused(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "DENY-1",
        [{"content": [tool("Bash", command="touch should-not-exist")]}, {"content": [text("ok")]}],
    )
    conn = await bridge.init({"disallowedTools": ["Bash"]})
    frames = await collect(conn, "DENY-1 try")
    refused = tool_results(frames)[0]
    assert refused["is_error"] is True
    assert "refused by permissions" in block_text(refused)
    assert not (bridge.workspace / "should-not-exist").exists()
    offered = [t["name"] for t in fake_model.requests_containing("DENY-1")[0]["body"]["tools"]]
    assert "Bash" not in offered
    assert "Read" in offered


async def test_permissions_by_agent(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    agent_dir = bridge.workspace / ".agent"
    agent_dir.mkdir()
    (agent_dir / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Read", "Bash(echo *)"]}}))
    fake_model.script(
        "PERM-1",
        [
            {
                "content": [
                    tool("Bash", command="echo allowed > yes.txt"),
                    tool("Bash", command="touch no.txt"),
                ]
            },
            {"content": [tool("Write", file_path="w.txt", content="x")]},
            {"content": [text("ok")]},
        ],
    )
    conn = await bridge.init({"permissionMode": "permissionsByAgent"})
    results = tool_results(await collect(conn, "PERM-1"))
    assert [bool(r.get("is_error")) for r in results] == [False, True, True]
    assert (bridge.workspace / "yes.txt").exists()
    assert not (bridge.workspace / "no.txt").exists()
    assert not (bridge.workspace / "w.txt").exists()


async def test_subagent_runs_via_task(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "MAIN-1",
        [
            {"content": [tool("Task", description="look", prompt="SUB-1 find it", subagent_type="researcher")]},
            {"content": [text("main done")]},
        ],
    )
    fake_model.script("SUB-1", [{"content": [tool("Read", file_path="x.txt")]}, {"content": [text("sub answer")]}])
    (bridge.workspace / "x.txt").write_text("content")
    subagents = {"researcher": {"description": "reads", "prompt": "You research.", "tools": ["Read"]}}
    conn = await bridge.init({"subagents": subagents})
    frames = await collect(conn, "MAIN-1")
    msgs = messages_of(frames)
    task_id = msgs[0]["message"]["content"][0]["id"]
    inner = [m for m in msgs if m.get("parent_tool_use_id") == task_id]
    assert [m["type"] for m in inner] == ["assistant", "user", "assistant"]
    outer = tool_results(frames)[-1]
    assert outer["tool_use_id"] == task_id
    assert block_text(outer) == "sub answer"
    sub_request = fake_model.requests_containing("SUB-1 find it")[1]["body"]
    assert system_text(sub_request) == "You research."
    assert [t["name"] for t in sub_request["tools"]] == ["Read"]
    assert result_of(frames)["num_turns"] == 4


async def test_initial_agent_sets_main_prompt(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    (bridge.workspace / "AGENT.md").write_text("Default agent prompt.")
    subagents = {"writer": {"description": "writes", "prompt": "You write.", "tools": ["Write"], "model": "haiku"}}
    conn = await bridge.init({"subagents": subagents, "initialAgent": "writer"})
    await collect(conn, "INIT-AGENT-1")
    body = fake_model.requests_containing("INIT-AGENT-1")[0]["body"]
    assert system_text(body) == "You write."
    assert [t["name"] for t in body["tools"]] == ["Write"]
    assert body["model"] == "claude-haiku-4-5"


async def test_system_prompt_model_precedence_and_key(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    (bridge.workspace / "AGENT.md").write_text("You are the test agent.")
    (bridge.workspace / ".agent").mkdir()
    (bridge.workspace / ".agent" / "settings.json").write_text(json.dumps({"model": "claude-from-settings"}))
    conn = await bridge.init({"betas": ["beta-one", "beta-two"]})
    await collect(conn, "PREC-1")
    await collect(conn, "PREC-2", model="claude-from-query")
    first = fake_model.requests_containing("PREC-1")[0]
    assert system_text(first["body"]) == "You are the test agent."
    assert first["body"]["model"] == "claude-from-settings"
    assert first["headers"]["x-api-key"] == TEST_API_KEY
    assert first["headers"]["anthropic-beta"] == "beta-one,beta-two"
    assert fake_model.requests_containing("PREC-2")[0]["body"]["model"] == "claude-from-query"
    conn2 = await bridge.init({"model": "claude-from-init"})
    await collect(conn2, "PREC-3")
    assert fake_model.requests_containing("PREC-3")[0]["body"]["model"] == "claude-from-init"


async def test_overloaded_then_success_is_retried(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "RETRY-1",
        [{"errors": [{"status": 529}, {"status": 429, "retryAfter": 0}], "content": [text("finally")]}],
    )
    conn = await bridge.init({})
    frames = await collect(conn, "RETRY-1")
    assert [f["type"] for f in frames][-1] == "done"
    assert "error" not in [f["type"] for f in frames]
    assert result_of(frames)["result"] == "finally"
    assert len(fake_model.requests_containing("RETRY-1")) == 3


async def test_bad_key_becomes_error_then_done(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("AUTH-1", [{"error": {"status": 401, "message": "invalid x-api-key"}}])
    conn = await bridge.init({})
    frames = await collect(conn, "AUTH-1")
    assert [f["type"] for f in frames] == ["message", "error", "done"]
    assert frames[1]["error"].startswith("model API rejected the API key (401)")
    res = frames[0]["data"]
    assert res["type"] == "result"
    assert res["is_error"] is True
    assert len(fake_model.requests_containing("AUTH-1")) == 1  # 401 is never retried


async def test_persistent_overload_gives_up_with_a_clear_error(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    errors = [{"status": 529, "message": "Overloaded", "retryAfter": 0}] * 10
    fake_model.script("OVER-1", [{"errors": errors, "content": [text("never")]}])
    conn = await bridge.init({})
    frames = await collect(conn, "OVER-1")
    assert [f["type"] for f in frames][-2:] == ["error", "done"]
    assert frames[-2]["error"] == "model API overloaded (529) after 3 retries: Overloaded"


async def test_missing_key_at_the_proxy(bridge: BridgeHarness) -> None:
    bridge.proxy.set_key_provider("test", lambda: None)
    conn = await bridge.init({})
    frames = await collect(conn, "NOKEY-1")
    assert "(401)" in frames[-2]["error"]


async def test_history_continues_a_conversation(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    stored: list[dict[str, Any]] = [
        {"type": "user", "content": "HIST-1 first question"},
        {
            "type": "assistant",
            "message": {
                "id": "m1",
                "role": "assistant",
                "content": [tool("Bash", command="true") | {"id": "t1"}],
            },
            "parent_tool_use_id": None,
        },
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": ""}],
            },
            "parent_tool_use_id": None,
        },
        {
            "type": "assistant",
            "message": {"id": "m2", "role": "assistant", "content": [text("first answer")]},
        },
        {"type": "result", "subtype": "success"},
    ]
    conn = await bridge.init({"history": history_from_stored(stored)})
    frames = await collect(conn, "HIST-1 second question")
    body = fake_model.requests_containing("second question")[0]["body"]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][1]["content"][0]["id"] == "t1"
    assert body["messages"][3]["content"][0]["text"] == "first answer"
    assert result_of(frames)["result"] == "echo: HIST-1 second question"
    # The bridge keeps the conversation between queries too.
    await collect(conn, "third")
    assert len(fake_model.requests_containing("third")[0]["body"]["messages"]) == 7


async def test_partial_messages_stream_deltas(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "PART-1",
        [
            {
                "content": [{"type": "thinking", "thinking": "let me think"}, text("streamed reply text")],
                "chunk": 4,
            }
        ],
    )
    conn = await bridge.init({})
    frames = await collect(conn, "PART-1", include_partial_messages=True)
    events = [m for m in messages_of(frames) if m["type"] == "stream_event"]
    deltas = [e["event"]["delta"] for e in events if e["event"]["type"] == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "streamed reply text"
    assert any(d["type"] == "thinking_delta" for d in deltas)
    assert events[0]["event"]["type"] == "message_start"
    assistant = next(m for m in messages_of(frames) if m["type"] == "assistant")
    assert assistant["message"]["content"][0]["type"] == "thinking"
    assert assistant["message"]["content"][0]["signature"]
    plain = await collect(conn, "no partials")
    assert not [m for m in messages_of(plain) if m["type"] == "stream_event"]


async def test_usage_in_the_result_adds_up(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "USAGE-1",
        [
            {
                "content": [tool("Bash", command="true")],
                "usage": {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 5},
            },
            {
                "content": [text("ok")],
                "usage": {"input_tokens": 200, "output_tokens": 20, "cache_read_input_tokens": 7},
            },
        ],
    )
    conn = await bridge.init({"model": "claude-sonnet-4-5"})
    res = result_of(await collect(conn, "USAGE-1"))
    assert res["usage"] == {
        "input_tokens": 300,
        "output_tokens": 30,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 7,
    }
    assert res["total_cost_usd"] > 0
    assert res["duration_ms"] >= res["duration_api_ms"] >= 0


async def test_max_turns(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("MAXT-1", [{"content": [tool("Bash", command="true")]}] * 5)
    conn = await bridge.init({"maxTurns": 2})
    res = result_of(await collect(conn, "MAXT-1"))
    assert res["subtype"] == "error_max_turns"
    assert res["is_error"] is True
    assert res["num_turns"] == 2


async def test_mcp_remote_streamable_http_server(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(MCP_SERVER), "--http", str(port), stderr=asyncio.subprocess.PIPE
    )
    try:
        assert server.stderr is not None
        async with asyncio.timeout(30):
            while b"Uvicorn running on" not in (line := await server.stderr.readline()):
                assert line, "MCP HTTP server exited before listening"
        mcp = {"mcpServers": {"remote": {"url": f"http://127.0.0.1:{port}/mcp"}}}
        (bridge.workspace / ".mcp.json").write_text(json.dumps(mcp))
        fake_model.script("MCPH-1", [{"content": [tool("mcp__remote__add", a=2, b=3)]}, {"content": [text("ok")]}])
        conn = await bridge.connect()
        init_ok = await conn.init({})
        assert init_ok["mcpServers"] == [{"name": "remote", "status": "pending"}]
        results = tool_results(await collect(conn, "MCPH-1"))
        assert block_text(results[0]) == "5"
    finally:
        server.terminate()
        await server.wait()


async def test_prompt_caching_breakpoints_and_cache_usage(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    (bridge.workspace / "AGENT.md").write_text("You are the caching agent.")
    fake_model.script(
        "CACHE-1",
        [
            {"content": [tool("Bash", command="echo one"), tool("Bash", command="echo two")]},
            {"content": [text("cached")]},
        ],
    )
    conn = await bridge.init({})
    first = result_of(await collect(conn, "CACHE-1 go"))
    second = result_of(await collect(conn, "CACHE-2 again"))
    bodies = [r["body"] for r in fake_model.requests_containing("CACHE-1")]
    assert len(bodies) == 3
    last_tool = bodies[0]["tools"][-1]["name"]
    # At most four: the tools, the system prompt, the end of the conversation and the user turn
    # before it (the prefix the previous call wrote).
    assert marked(bodies[0]) == [f"tool:{last_tool}", "system", "message:0"]
    assert marked(bodies[1]) == [f"tool:{last_tool}", "system", "message:0", "message:2"]
    assert marked(bodies[2]) == [f"tool:{last_tool}", "system", "message:2", "message:4"]
    # Only the request carries the marks: the conversation the engine keeps (and emits) has none.
    assert "cache_control" not in json.dumps(bodies[2]["messages"][1])
    assert bodies[2]["messages"][2]["content"][-1]["type"] == "tool_result"
    # The fake caches like the API: later calls read what earlier ones wrote, and the result says so.
    assert first["usage"]["cache_creation_input_tokens"] > 0
    assert first["usage"]["cache_read_input_tokens"] > 0
    # The next query reads the longer prefix the previous call wrote (through its tool results).
    assert second["usage"]["cache_read_input_tokens"] > first["usage"]["cache_read_input_tokens"]


def summary_script(fake_model: FakeModel, summary: str) -> None:
    """The compaction's summary call, answered by its instruction (the longest match wins)."""
    fake_model.script(SUMMARY_INSTRUCTION[:60], [{"content": [text(summary)]}])


def compactions(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages_of(frames) if m["type"] == "system" and m.get("subtype") == "compact_boundary"]


def first_text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else content[0]["text"]


# An unknown model: the window is the init's contextWindow (the server's SERVICE_MODEL_CONTEXT_WINDOW).
SMALL_WINDOW = {"model": "claude-fake-model", "contextWindow": 8000, "maxTokens": 1000}


def print_chars(char: str, count: int = 9000) -> dict[str, Any]:
    return tool("Bash", command=f"python3 -c \"print('{char}' * {count})\"")


async def test_a_conversation_past_the_window_is_compacted_and_goes_on(
    bridge: BridgeHarness, fake_model: FakeModel
) -> None:
    summary_script(fake_model, "SUMMARY-OF-OVF: printed a and b")
    fake_model.script(
        "OVF-1",
        [
            {"content": [print_chars("a")]},
            {"content": [print_chars("b")]},
            {"content": [print_chars("c")]},
            {"content": [text("overflow done")]},
        ],
        sequential=True,
    )
    conn = await bridge.init(SMALL_WINDOW)
    frames = await collect(conn, "OVF-1 print three blocks")
    res = result_of(frames)
    assert res["subtype"] == "success" and res["result"] == "overflow done"
    [boundary] = compactions(frames)
    assert boundary["compact_metadata"]["trigger"] == "auto"
    assert boundary["compact_metadata"]["pre_tokens"] > 0.85 * 8000 - 1000
    kept = boundary["compaction"]
    # The last model turn and its tool result are kept verbatim (the open tool call); the rest is summarised.
    third_use = [m for m in messages_of(frames) if m["type"] == "assistant"][2]["message"]["content"][0]
    assert (kept["summarisedMessages"], kept["keptMessages"], kept["keptToolUseIds"]) == (5, 2, [third_use["id"]])
    requests = [r["body"] for r in fake_model.requests if "OVF-1" in json.dumps(r["body"])]
    summarising = [b for b in requests if SUMMARY_INSTRUCTION in json.dumps(b)]
    assert len(summarising) == 1 and summarising[0]["tool_choice"] == {"type": "none"}
    assert len(summarising[0]["messages"]) == 5
    after = requests[-1]["messages"]
    assert len(after) == 3  # the summary, then the kept model turn and its tool result
    assert first_text(after[0]).startswith(SUMMARY_HEADER.format(count=5))
    assert "SUMMARY-OF-OVF" in first_text(after[0])
    assert f"{CURRENT_REQUEST}\nOVF-1 print three blocks" in first_text(after[0])
    assert after[1]["content"][0]["id"] == third_use["id"]
    assert "c" * 9000 in json.dumps(after[2])
    # Nothing the service stores is lost: every turn and tool result was emitted as it happened.
    assert len([m for m in messages_of(frames) if m["type"] == "assistant"]) == 4
    assert len(tool_results(frames)) == 3
    # The summary call is paid for like any other.
    assert res["usage"]["output_tokens"] >= sum(
        m["message"]["usage"]["output_tokens"] for m in messages_of(frames) if m["type"] == "assistant"
    )

    # A cold resume rebuilds the compacted view from the stored messages (the compaction included).
    stored = [{"type": "user", "content": "OVF-1 print three blocks"}, *messages_of(frames)]
    history = history_from_stored(stored)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert first_text(history[0]) == kept["summary"]
    conn2 = await bridge.init({**SMALL_WINDOW, "history": history})
    await collect(conn2, "OVF-2 and now")
    resumed = fake_model.requests_containing("OVF-2 and now")[0]["body"]["messages"]
    assert first_text(resumed[0]) == kept["summary"]
    assert len(resumed) == 5


async def test_prompt_too_long_compacts_and_recovers(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    summary_script(fake_model, "SUMMARY-PTL: said hello")
    too_long = {"status": 400, "type": "invalid_request_error", "message": "prompt is too long: 212000 tokens > 200000 maximum"}
    fake_model.script("PTL-1", [{"errors": [too_long], "content": [text("recovered")]}])
    fake_model.script("PTL-X", [{"error": too_long}])
    conn = await bridge.init({})
    await collect(conn, "PTL-0 hello")
    frames = await collect(conn, "PTL-1 go on")
    res = result_of(frames)
    assert res["subtype"] == "success" and res["result"] == "recovered"
    [boundary] = compactions(frames)
    assert boundary["compact_metadata"]["trigger"] == "prompt_too_long"
    retried = fake_model.requests_containing("PTL-1 go on")[-1]["body"]["messages"]
    assert "SUMMARY-PTL" in first_text(retried[0])
    assert retried[-1]["content"][0]["text"] == "PTL-1 go on"

    # With nothing left to compact, the turn fails with words a person can act on.
    fresh = await bridge.init({})
    failed = result_of(await collect(fresh, "PTL-X alone"))
    assert failed["is_error"] is True
    assert "does not fit the model's context window" in failed["result"]
