"""Turns cut short are stored as interrupted and never replayed: a real `ashd serve` killed with
SIGKILL mid-turn, a sandbox killed mid-turn, and an interrupt. The fake model's captured requests
show what the model was asked afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames
from tests.integration.test_session_restart import Proc, _call, http, proc  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox

CUT = "zebra-cut-7731"
NEXT = "yak-next-2290"


def script_cut_turn(fake: FakeModel) -> None:
    """The turn to be cut: a tool call that writes a file, then a reply that streams for a long time."""
    fake.script(CUT, [
        {"content": [{"type": "tool_use", "name": "Write",
                      "input": {"file_path": "/workspace/cut.txt", "content": "written once"}}]},
        {"content": [{"type": "text", "text": "y" * 4000}], "chunk": 4, "delay": 0.05},
    ])


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60) -> None:
    """Wait for a condition of the system under test (polled), failing with `what` after `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))


def assert_cut_turn_not_replayed(fake: FakeModel) -> None:
    """Every model request made for NEXT: the prompt stands alone and the cut turn reads as interrupted."""
    requests = fake.requests_containing(NEXT)
    assert requests, "the next prompt never reached the model"
    for request in requests:
        messages = request["body"]["messages"]
        with_next = [i for i, m in enumerate(messages) if m["role"] == "user" and NEXT in _text(m)]
        with_cut = [i for i, m in enumerate(messages) if m["role"] == "user" and CUT in _text(m)]
        assert len(with_next) == 1 and len(with_cut) == 1, messages
        assert CUT not in _text(messages[with_next[0]]), "the cut prompt was merged into the next one"
        between = messages[with_cut[0] + 1:with_next[0]]
        assert any(m["role"] == "assistant" and "interrupted" in _text(m) for m in between), between
        latest_user_text = next(_text(m) for m in reversed(messages) if m["role"] == "user" and _text(m).strip())
        assert CUT not in latest_user_text
    # The cut turn's script (its Write call) was not run again: one request per script turn, before the cut.
    replayed = [r for r in fake.requests_containing(CUT) if NEXT not in json.dumps(r["body"])]
    assert len(replayed) == 2


async def test_server_killed_mid_turn(proc: Proc, http: aiohttp.ClientSession,  # noqa: F811
                                      fake_model: FakeModel) -> None:  # noqa: F811
    key = await proc.start()
    status, body = await _call(http, proc, key, "POST", "/api/agents", json={"name": "helper", "systemPrompt": "Hi."})
    assert status == 201, body
    status, body = await _call(http, proc, key, "POST", "/api/sessions", json={"agent": "helper"})
    assert status == 201, body
    sid = body["session"]["id"]
    status, frames = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/messages",
                                 json={"content": "a first turn that finishes"})
    assert status == 200 and frames[-1].event == "done"
    script_cut_turn(fake_model)

    async def stream() -> None:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(f"{proc.url}/api/sessions/{sid}/messages", json={"content": f"{CUT} please"},
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
                await resp.read()

    client = asyncio.get_running_loop().create_task(stream())

    async def tool_result_stored() -> bool:
        _, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/messages")
        return any('"tool_result"' in m["content"] for m in body["messages"])

    async def second_model_call() -> bool:
        return len(fake_model.requests_containing(CUT)) >= 2

    await until(tool_result_stored, "the cut turn's tool result to be stored")
    await until(second_model_call, "the model to be streaming the cut turn's reply")
    proc.kill()
    await client

    key = await proc.start()
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "paused"
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/events?type=error")
    assert json.loads(body["events"][-1]["data"]) == {
        "error": "interrupted: the server stopped before this turn finished"}
    status, frames = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/stream")
    assert [f.event for f in frames[-2:]] == ["error", "done"]  # the replayed stream ends like any other
    assert [f.event for f in frames].count("done") == 2  # one per turn

    status, body = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/resume")
    assert status == 200, body
    status, frames = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/messages", json={"content": NEXT})
    assert status == 200 and frames[-1].event == "done"
    blocks = [b for f in frames if f.event == "message" and f.data["type"] == "assistant"
              for b in f.data["message"]["content"]]
    assert [b["type"] for b in blocks] == ["text"] and blocks[0]["text"] == f"echo: {NEXT}"  # no Write again
    assert_cut_turn_not_replayed(fake_model)


async def test_sandbox_killed_mid_turn(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    script_cut_turn(fake_model)
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages", json={"content": f"{CUT} please"},
                                  headers=sapi.headers())
    assert resp.status == 200

    async def second_model_call() -> bool:
        return len(fake_model.requests_containing(CUT)) >= 2

    await until(second_model_call, "the model to be streaming the cut turn's reply")
    components = sapi.server.components
    assert components is not None and components.local is not None
    _, body = await sapi.call("GET", f"/api/sessions/{sid}")
    sandbox = components.local.launcher.process(body["session"]["sandboxId"])
    assert sandbox is not None
    sandbox.kill()
    frames = parse_frames((await resp.content.read()).decode())
    assert [f.event for f in frames if f.event in ("error", "done")] == ["error", "done"]
    _, body = await sapi.call("GET", f"/api/sessions/{sid}/events?type=error")
    assert "sandbox crashed" in json.loads(body["events"][-1]["data"])["error"]

    status, frames = await send(sapi, sid, NEXT)  # a new sandbox, the history from storage
    assert status == 200 and frames[-1].event == "done"
    assert_cut_turn_not_replayed(fake_model)


async def test_interrupted_turn_in_a_live_sandbox(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    script_cut_turn(fake_model)
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages", json={"content": f"{CUT} please"},
                                  headers=sapi.headers())

    async def second_model_call() -> bool:
        return len(fake_model.requests_containing(CUT)) >= 2

    await until(second_model_call, "the model to be streaming the cut turn's reply")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/interrupt")
    assert status == 200, body
    frames = parse_frames((await resp.content.read()).decode())
    assert frames[-1].event == "done"
    status, frames = await send(sapi, sid, NEXT)  # the same sandbox and engine as the cut turn
    assert status == 200 and frames[-1].event == "done"
    assert_cut_turn_not_replayed(fake_model)
