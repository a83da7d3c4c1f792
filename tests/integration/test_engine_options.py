# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""Per-message options and live config in the built-in engine: real bridge process → anthropic SDK →
ModelProxy → fake model, whose recorded requests show what reached the model."""

from __future__ import annotations

from typing import Any

from ashd.bridge.engine._structured import REMINDER
from ashd.devtools.fake_model import FakeModel
from tests.fixtures.bridge_fixture import BridgeHarness, bridge, collect, messages_of  # noqa: F401
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_engine import result_of, text, tool, tool_results

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}


async def test_thinking_and_effort_reach_the_model(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("OPT-THINK", [{"content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                                 tool("Bash", command="true")]},
                                    {"content": [text("thought it through")]}])
    conn = await bridge.init({})
    frames = await collect(conn, "OPT-THINK go", effort="high", thinking={"type": "enabled", "budget_tokens": 2048})
    assert result_of(frames)["subtype"] == "success"
    requests = fake_model.requests_containing("OPT-THINK")
    assert len(requests) == 2
    for req in requests:  # every call of the turn, the tool loop's included
        assert req["body"]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        assert req["body"]["max_tokens"] == 2048 + 8192  # the API wants max_tokens above the budget
        assert req["body"]["output_config"] == {"effort": "high"}
        assert "effort-2025-11-24" in req["headers"]["anthropic-beta"]
    # the thinking block of the first call is sent back with the tool result, as the API requires
    assert requests[1]["body"]["messages"][1]["content"][0]["type"] == "thinking"
    # options are per message: the next one has none of them
    await collect(conn, "NEXTMSG-T plain")
    (plain,) = fake_model.requests_containing("NEXTMSG-T")
    assert "thinking" not in plain["body"] and "output_config" not in plain["body"]
    assert plain["body"]["max_tokens"] == 8192


async def test_max_turns_of_a_message_stops_the_loop(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("OPT-MAXT", [{"content": [tool("Bash", command="true")]}] * 5 + [{"content": [text("end")]}])
    conn = await bridge.init({})
    res = result_of(await collect(conn, "OPT-MAXT run", maxTurns=2))
    assert (res["subtype"], res["is_error"], res["num_turns"]) == ("error_max_turns", True, 2)
    assert res["result"] == "stopped after reaching the maximum of 2 turns"
    assert len(fake_model.requests_containing("OPT-MAXT run")) == 2


async def test_output_format_gives_a_validated_structured_result(bridge: BridgeHarness,
                                                                 fake_model: FakeModel) -> None:
    fake_model.script("OPT-JSON", [
        {"content": [text("looking"), tool("Bash", command="echo 3")]},
        {"content": [tool("StructuredOutput", city="Oslo", population="many")]},  # wrong type: corrected
        {"content": [text("Here it is."), tool("StructuredOutput", city="Oslo", population=709000)]},
    ])
    conn = await bridge.init({"systemPrompt": "You are a geographer."})
    frames = await collect(conn, "OPT-JSON capital of Norway",
                           outputFormat={"type": "json_schema", "schema": SCHEMA})
    res = result_of(frames)
    assert res["subtype"] == "success" and res["is_error"] is False
    assert res["structured_output"] == {"city": "Oslo", "population": 709000}
    assert res["result"] == "Here it is."
    results = tool_results(frames)
    assert results[1]["is_error"] is True and "population" in results[1]["content"]
    assert "is_error" not in results[2]
    first = fake_model.requests_containing("OPT-JSON")[0]["body"]
    offered = {t["name"]: t for t in first["tools"]}
    assert offered["StructuredOutput"]["input_schema"] == SCHEMA
    system = "".join(b["text"] for b in first["system"])
    assert system.startswith("You are a geographer.") and "StructuredOutput" in system
    assert len(fake_model.requests_containing("OPT-JSON")) == 3  # no call after the accepted answer
    # a later message without outputFormat offers no StructuredOutput tool
    await collect(conn, "LATER-J hi")
    (later,) = fake_model.requests_containing("LATER-J")
    assert "StructuredOutput" not in {t["name"] for t in later["body"]["tools"]}


async def test_output_format_asks_again_then_forces_the_tool(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script("OPT-ASK", [{"content": [text("Oslo, about 700k people")]}])
    fake_model.script(REMINDER[:40], [{"content": [tool("StructuredOutput", output=["Oslo"])]}])
    conn = await bridge.init({})
    frames = await collect(conn, "OPT-ASK capital?",
                           outputFormat={"type": "json_schema", "schema": {"type": "array", "items": {"type": "string"}}})
    res = result_of(frames)
    assert res["subtype"] == "success" and res["structured_output"] == ["Oslo"]
    asked = [r["body"] for r in fake_model.requests if REMINDER[:40] in str(r["body"]["messages"][-1])]
    assert len(asked) == 1
    assert asked[0]["tool_choice"] == {"type": "tool", "name": "StructuredOutput"}
    # a schema that is not an object is wrapped: the tool's input is {output: ...}
    wrapped = {t["name"]: t for t in asked[0]["tools"]}["StructuredOutput"]["input_schema"]
    assert wrapped["required"] == ["output"]
    users = [m for m in messages_of(frames) if m["type"] == "user"]
    assert users[0]["message"]["content"][0]["text"] == REMINDER  # stored with the conversation


async def test_output_format_gives_up_after_repeated_bad_answers(bridge: BridgeHarness,
                                                                fake_model: FakeModel) -> None:
    fake_model.script("OPT-BAD", [{"content": [tool("StructuredOutput", city=1)]}] * 10)
    conn = await bridge.init({})
    res = result_of(await collect(conn, "OPT-BAD go", outputFormat={"type": "json_schema", "schema": SCHEMA}))
    assert res["subtype"] == "error_max_structured_output_retries" and res["is_error"] is True
    assert "structured_output" not in res
    assert len(fake_model.requests_containing("OPT-BAD")) == 6


async def test_live_config_in_a_query_changes_tools_model_and_betas(bridge: BridgeHarness,
                                                                   fake_model: FakeModel) -> None:
    conn = await bridge.init({"model": "m-first"})
    await collect(conn, "OPT-CFG-1 hi")
    config: dict[str, Any] = {"model": "m-second", "allowedTools": ["Read", "Glob"], "betas": ["beta-x"],
                              "subagents": {"helper": {"description": "helps", "prompt": "Help.", "model": "haiku"}},
                              "initialAgent": "helper"}
    await collect(conn, "OPT-CFG-2 hi", config=config)
    before = fake_model.requests_containing("OPT-CFG-1")[0]
    after = fake_model.requests_containing("OPT-CFG-2")[0]
    assert before["body"]["model"] == "m-first" and "Bash" in {t["name"] for t in before["body"]["tools"]}
    assert after["body"]["model"] == "m-second"  # the session's model wins over the initialAgent's
    assert {t["name"] for t in after["body"]["tools"]} == {"Read", "Glob"}
    assert after["headers"]["anthropic-beta"] == "beta-x"
    assert "".join(b["text"] for b in after["body"]["system"]) == "Help."
    # and it stays for the following queries; a null clears
    await collect(conn, "OPT-CFG-3 hi", config={"allowedTools": None, "initialAgent": None})
    third = fake_model.requests_containing("OPT-CFG-3")[0]
    assert third["body"]["model"] == "m-second" and "Bash" in {t["name"] for t in third["body"]["tools"]}
