# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""Message options and PATCH .../config through the HTTP API: a real server, sandboxes, bridge and
engine, SQLite and PostgreSQL; the fake model's recorded requests show what reached the model."""

from __future__ import annotations

from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def result_of(frames: list[Any]) -> dict[str, Any]:
    (result,) = [f.data for f in frames if f.event == "message" and f.data["type"] == "result"]
    return dict(result)


async def patch(api: Api, sid: str, body: dict[str, Any]) -> tuple[int, Any]:
    return await api.call("PATCH", f"/api/sessions/{sid}/config", json=body)


@pytest.mark.parametrize(("body", "field"), [
    ({"maxTurns": 0}, "maxTurns"),
    ({"maxTurns": True}, "maxTurns"),
    ({"effort": "extreme"}, "effort"),
    ({"thinking": {"type": "enabled"}}, "thinking.budgetTokens"),
    ({"thinking": {"type": "enabled", "budgetTokens": 100}}, "thinking.budgetTokens"),
    ({"thinking": {"type": "enabled", "budgetTokens": 30000}}, "SERVICE_MODEL_MAX_TOKENS"),
    ({"thinking": {"type": "disabled", "budgetTokens": 2000}}, "thinking.budgetTokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"outputFormat": {"type": "text", "schema": {}}}, "outputFormat.type"),
    ({"outputFormat": {"type": "json_schema"}}, "outputFormat.schema"),
    ({"outputFormat": {"type": "json_schema", "schema": {"type": "nope"}}}, "outputFormat.schema"),
])
async def test_bad_message_options_are_400_naming_the_field(sapi: Api, body: dict[str, Any],  # noqa: F811
                                                            field: str) -> None:
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, (reply,) = await send(sapi, sid, "never sent", **body)
    assert (status, reply["statusCode"]) == (400, 400) and field in reply["error"], reply


async def test_options_reach_the_model_and_shape_the_result(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("MO-LOOP", [{"content": [tool("Bash", command="true")]}] * 6)
    status, frames = await send(sapi, sid, "MO-LOOP work", maxTurns=3, effort="low",
                                thinking={"type": "enabled", "budgetTokens": 4000})
    assert status == 200 and frames[-1].event == "done"
    result = result_of(frames)
    assert (result["subtype"], result["num_turns"]) == ("error_max_turns", 3)
    assert "maximum of 3 turns" in result["result"]
    requests = fake_model.requests_containing("MO-LOOP")
    assert len(requests) == 3
    assert requests[0]["body"]["thinking"] == {"type": "enabled", "budget_tokens": 4000}
    assert requests[0]["body"]["max_tokens"] == 4000 + 8192
    assert requests[0]["body"]["output_config"] == {"effort": "low"}

    fake_model.script("MO-JSON", [{"content": [{"type": "text", "text": "42."}, tool("StructuredOutput", answer=42)]}])
    status, frames = await send(sapi, sid, "MO-JSON the answer?",
                                outputFormat={"type": "json_schema", "schema": SCHEMA})
    result = result_of(frames)
    assert result["subtype"] == "success" and result["structured_output"] == {"answer": 42}
    offered = {t["name"]: t for t in fake_model.requests_containing("MO-JSON")[0]["body"]["tools"]}
    assert offered["StructuredOutput"]["input_schema"] == SCHEMA


async def test_max_budget_ends_the_turn_with_a_result(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("MO-BUDGET", [{"content": [tool("Bash", command="true")],
                                     "usage": {"input_tokens": 50_000, "output_tokens": 10_000}}] * 3)
    status, frames = await send(sapi, sid, "MO-BUDGET spend", maxBudgetUsd=0.01)
    result = result_of(frames)
    assert (result["subtype"], result["is_error"]) == ("error_max_budget_usd", True)
    assert "maxBudgetUsd of $0.01 is used up" in result["result"]
    assert len(fake_model.requests_containing("MO-BUDGET")) == 1
    assert [f.event for f in frames][-2:] == ["error", "done"]


async def test_patch_config_applies_from_the_next_turn_warm_and_cold(sapi: Api,  # noqa: F811
                                                                     fake_model: FakeModel) -> None:
    await deploy(sapi)
    sid = (await create(sapi, model="m-created"))["id"]
    await send(sapi, sid, "PC-ONE hi")
    status, body = await patch(sapi, sid, {"model": "m-patched", "allowedTools": ["Read", "Grep"],
                                           "betas": ["beta-patched"]})
    assert status == 200, body
    session = body["session"]
    assert (session["model"], session["allowedTools"], session["betas"]) == (
        "m-patched", ["Read", "Grep"], ["beta-patched"])
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["model"] == "m-patched"
    await send(sapi, sid, "PC-TWO hi")
    one = fake_model.requests_containing("PC-ONE")[0]
    two = fake_model.requests_containing("PC-TWO")[0]
    assert one["body"]["model"] == "m-created" and "Bash" in {t["name"] for t in one["body"]["tools"]}
    assert two["body"]["model"] == "m-patched"
    assert {t["name"] for t in two["body"]["tools"]} == {"Read", "Grep"}
    assert "beta-patched" in two["headers"]["anthropic-beta"]

    # paused: stored now, applied after a warm resume
    assert (await sapi.call("POST", f"/api/sessions/{sid}/pause"))[0] == 200
    status, body = await patch(sapi, sid, {"model": "m-while-paused", "allowedTools": None})
    assert status == 200 and "allowedTools" not in body["session"], body
    assert (await sapi.call("POST", f"/api/sessions/{sid}/resume"))[0] == 200
    await send(sapi, sid, "PC-THREE hi")
    three = fake_model.requests_containing("PC-THREE")[0]
    assert three["body"]["model"] == "m-while-paused" and "Bash" in {t["name"] for t in three["body"]["tools"]}

    # stopped: a cold resume starts a new sandbox from the stored config
    assert (await sapi.call("POST", f"/api/sessions/{sid}/stop"))[0] == 200
    subagents = {"critic": {"description": "reviews", "prompt": "You review.", "tools": ["Read"]}}
    status, body = await patch(sapi, sid, {"subagents": subagents, "initialAgent": "critic", "model": "m-cold"})
    assert status == 200, body
    assert (await sapi.call("POST", f"/api/sessions/{sid}/resume"))[0] == 200
    await send(sapi, sid, "PC-FOUR hi")
    four = fake_model.requests_containing("PC-FOUR")[0]
    assert four["body"]["model"] == "m-cold" and [t["name"] for t in four["body"]["tools"]] == ["Read"]
    assert "".join(b["text"] for b in four["body"]["system"]) == "You review."
    assert "PC-ONE" in str(four["body"]["messages"])  # the conversation came back with it


async def test_patch_config_refusals(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    refused: list[tuple[dict[str, Any], str]] = [
        ({}, "Nothing to change"), ({"model": ""}, "model"), ({"allowedTools": "Read"}, "allowedTools"),
        ({"subagents": {"a": "text"}}, "subagents.a"), ({"initialAgent": "ghost"}, "initialAgent"),
        ({"subagents": {"a": {"tools": "Read"}}}, "subagents.a.tools"), ({"tools": ["Read"]}, "tools")]
    for body, field in refused:
        status, reply = await patch(sapi, sid, body)
        assert (status, reply["statusCode"]) == (400, 400) and field in reply["error"], (body, reply)
    status, reply = await patch(sapi, "00000000-0000-4000-8000-000000000000", {"model": "m"})
    assert status == 404, reply
    other = await sapi.new_tenant_key("other-tenant")
    status, reply = await sapi.call("PATCH", f"/api/sessions/{sid}/config", json={"model": "m"}, key=other)
    assert status == 404, reply
    assert (await sapi.call("DELETE", f"/api/sessions/{sid}"))[0] == 200
    status, reply = await patch(sapi, sid, {"model": "m"})
    assert (status, reply["statusCode"]) == (410, 410) and "ended" in reply["error"], reply


async def test_patch_during_a_turn_applies_to_the_next_one(sapi: Api, fake_model: FakeModel) -> None:
    import asyncio

    await deploy(sapi)
    sid = (await create(sapi, model="m-running"))["id"]
    fake_model.script("PD-RUN", [{"content": [tool("Bash", command="sleep 1")]},
                                 {"content": [{"type": "text", "text": "done"}]}])
    turn = asyncio.create_task(send(sapi, sid, "PD-RUN go"))
    for _ in range(200):  # the turn is running once the model got its first call
        if fake_model.requests_containing("PD-RUN"):
            break
        await asyncio.sleep(0.05)
    status, body = await patch(sapi, sid, {"model": "m-next"})
    assert status == 200 and body["session"]["model"] == "m-next", body
    status, frames = await turn
    assert status == 200 and result_of(frames)["subtype"] == "success"
    running = fake_model.requests_containing("PD-RUN")
    assert len(running) == 2 and {r["body"]["model"] for r in running} == {"m-running"}  # kept its own
    await send(sapi, sid, "PD-NEXT hi")
    assert fake_model.requests_containing("PD-NEXT")[0]["body"]["model"] == "m-next"
