"""Sessions end to end through real HTTP: real sandboxes, a real bridge, the fake model."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.actors._session import INLINE_COPY_ENTRIES
from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames

pytestmark = pytest.mark.sandbox


@pytest.fixture
async def sapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key"))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def deploy(api: Api, name: str = "helper", prompt: str = "You are helpful.") -> dict[str, Any]:
    status, body = await api.call("POST", "/api/agents", json={"name": name, "systemPrompt": prompt})
    assert status == 201, body
    agent: dict[str, Any] = body["agent"]
    return agent


async def create(api: Api, **extra: Any) -> dict[str, Any]:
    status, body = await api.call("POST", "/api/sessions", json={"agent": "helper", **extra})
    assert status == 201, body
    session: dict[str, Any] = body["session"]
    return session


async def send(api: Api, sid: str, content: str, **extra: Any) -> tuple[int, list[Any]]:
    resp = await api.client.post(f"/api/sessions/{sid}/messages", json={"content": content, **extra},
                                 headers=api.headers())
    text = await resp.text()
    if resp.status != 200:
        return resp.status, [json.loads(text)]
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return resp.status, parse_frames(text)


async def test_create_message_pause_resume_delete(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    session = await create(sapi)
    assert session["status"] == "active" and session["sandboxId"]
    sid = session["id"]

    status, frames = await send(sapi, sid, "hello there")
    assert status == 200
    events = [f.event for f in frames]
    assert events[-1] == "done" and events.count("done") == 1
    assert frames[-1].data == {"sessionId": sid}
    messages = [f.data for f in frames if f.event == "message"]
    assert any(m["type"] == "assistant" for m in messages)
    assert messages[-1]["type"] == "result"
    ids = [f.id for f in frames]
    assert all(i is not None for i in ids) and ids == sorted(ids)
    # the server's key reached the model; the sandbox never had it
    sent = fake_model.requests_containing("hello there")
    assert sent and sent[0]["headers"].get("x-api-key") == "sk-ant-test-server-key"

    status, body = await sapi.call("GET", f"/api/sessions/{sid}/messages")
    assert status == 200
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user" and "assistant" in roles
    assert json.loads(body["messages"][0]["content"]) == {"type": "user", "content": "hello there"}
    seqs = [m["sequence"] for m in body["messages"]]
    assert seqs == sorted(seqs)

    status, body = await sapi.call("GET", f"/api/sessions/{sid}/events")
    types = {e["type"] for e in body["events"]}
    assert {"lifecycle", "text", "turn_complete"} <= types

    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200 and body["session"]["status"] == "paused"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 400 and "paused" in body["error"]
    status, body = await send(sapi, sid, "while paused")
    assert status == 400
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    status, frames = await send(sapi, sid, "again")
    assert status == 200 and frames[-1].event == "done"

    status, body = await sapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "ended"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 410
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/messages")
    assert status == 200 and len(body["messages"]) >= 4



async def test_actors_are_let_go_when_they_hold_nothing(sapi: Api) -> None:
    await deploy(sapi)
    registry = sapi.server.components.local.registry  # type: ignore[union-attr]
    sid = (await create(sapi))["id"]
    assert registry.live_actors() == 1
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/stop")
    assert status == 200 and body["session"]["status"] == "stopped"
    assert registry.live_actors() == 0  # no sandbox, no turn: no thread kept for it
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "stopped"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    assert registry.live_actors() == 1
    status, body = await sapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200 and registry.live_actors() == 0


async def test_sandbox_killed_mid_turn_gives_error_then_done_and_recovers(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("SLOW-CRASH", [{"content": [{"type": "text", "text": "x" * 4000}], "chunk": 8, "delay": 0.01}])
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages",
                                  json={"content": "SLOW-CRASH", "includePartialMessages": True}, headers=sapi.headers())
    assert resp.status == 200
    await resp.content.readline()  # the stream has started
    components = sapi.server.components
    assert components is not None and components.local is not None
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    proc = components.local.launcher.process(body["session"]["sandboxId"])
    assert proc is not None
    proc.kill()
    frames = parse_frames((await resp.content.read()).decode())
    errors = [f for f in frames if f.event == "error"]
    assert len(errors) == 1 and "sandbox" in errors[0].data["error"]
    assert frames[-1].event == "done" and [f.event for f in frames].count("done") == 1
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/events?type=error")
    assert any("sandbox" in e["data"] for e in body["events"])
    # the next message brings the session back on a new sandbox, with its history
    status, frames = await send(sapi, sid, "after the crash")
    assert status == 200 and frames[-1].event == "done"
    assert "SLOW-CRASH" in str(fake_model.requests_containing("after the crash")[0]["body"]["messages"])


async def test_a_sandbox_killed_between_requests_is_replaced_by_the_next(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    """The sandbox dies and, at once, before its pool has noticed, the next request comes: a turn's
    start or a resume, which the loop may handle itself while the session's actor is idle
    (`actors/_inline.py`). Finding the sandbox gone, it goes on on the actor's thread (a cold start
    asks the pool) and brings the session back on a new sandbox, with its history and with the files
    the dead sandbox's workspace held (saved by the pool before it answers). The row names the new
    sandbox (a restart after a kill rescues the workspace of the sandbox the row names), and a
    `resumed` event says why."""
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    components = sapi.server.components
    assert components is not None and components.local is not None
    launcher = components.local.launcher

    async def write_then_kill(name: str) -> str:
        status, body = await sapi.call("POST", f"/api/sessions/{sid}/exec",
                                       json={"command": f"echo kept > {name}"})
        assert status == 200 and body["exitCode"] == 0, body
        sandbox_id = await live_sandbox()
        proc = launcher.process(sandbox_id)
        assert proc is not None, sandbox_id
        proc.kill()
        proc.wait(10)  # dead before the request below is even sent
        return sandbox_id

    async def live_sandbox() -> str:
        status, body = await sapi.call("GET", f"/api/sessions/{sid}")
        assert status == 200
        sandbox_id = str(body["session"]["sandboxId"])
        assert launcher.process(sandbox_id) is not None, "the session names a sandbox that is not running"
        return sandbox_id

    async def resumes() -> list[dict[str, Any]]:
        status, body = await sapi.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
        assert status == 200
        events = [json.loads(e["data"]) for e in body["events"]]
        return [e for e in events if e["action"] == "resumed"]

    async def file_text(name: str) -> str:
        resp = await sapi.client.get(f"/api/sessions/{sid}/files/{name}", headers=sapi.headers())
        assert resp.status == 200, await resp.text()
        return await resp.text()

    status, frames = await send(sapi, sid, "first")
    assert status == 200 and frames[-1].event == "done"
    first = await write_then_kill("one.txt")
    status, frames = await send(sapi, sid, "after the kill")
    assert status == 200 and frames[-1].event == "done", frames
    assert "first" in str(fake_model.requests_containing("after the kill")[0]["body"]["messages"])
    second = await live_sandbox()
    assert second != first
    assert (await resumes())[-1] == {"action": "resumed", "status": "active", "path": "cold",
                                     "reason": "sandbox_lost", "workspaceRestored": True}
    assert await file_text("one.txt") == "kept\n"

    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200 and body["session"]["status"] == "paused", body
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")  # warm: the same sandbox
    assert status == 200 and body["session"]["sandboxId"] == second, body
    await write_then_kill("two.txt")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200 and body["session"]["status"] == "paused", body
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active" and body["session"]["workspaceRestored"], body
    assert (await resumes())[-1]["path"] == "cold"
    assert await live_sandbox() not in (first, second)
    assert await file_text("one.txt") == await file_text("two.txt") == "kept\n"
    status, frames = await send(sapi, sid, "after the resume")
    assert status == 200 and frames[-1].event == "done"


def _actor_threads(session_id: str) -> list[str]:
    """The live threads of `session_id`'s actor in this process (`SessionActor.lazy_thread`)."""
    return [t.name for t in threading.enumerate()
            if getattr(getattr(getattr(t, "_target", None), "__self__", None), "session_id", None) == session_id]


async def test_a_create_handled_on_the_loop_starts_no_actor_thread_and_a_large_agent_folder_goes_to_one(
        aiohttp_client: Any, settings: Settings, fake_model: FakeModel, tmp_path: Path) -> None:  # noqa: F811
    """A create that claims a pre-warmed sandbox, a pause, a resume and a DELETE are handled on the
    loop (`SessionActor._inline_ok`): the session's actor never starts its thread. An agent folder
    over INLINE_COPY_ENTRIES entries is copied on the actor's thread instead, whole."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, prewarm=1, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key"))
    try:
        await _test_inline_create(api, tmp_path)
    finally:
        await api.client.close()
        await server.stop()


async def _warm(api: Api) -> None:
    async with asyncio.timeout(30):
        while (await api.call("GET", "/health"))[1]["pool"]["warm"] < 1:
            await asyncio.sleep(0.02)


async def _test_inline_create(api: Api, tmp_path: Path) -> None:
    await deploy(api)
    await _warm(api)
    sid = (await create(api))["id"]
    assert not _actor_threads(sid)
    for path in ("pause", "resume"):
        status, body = await api.call("POST", f"/api/sessions/{sid}/{path}")
        assert status == 200, body
        assert not _actor_threads(sid), path
    status, body = await api.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "ended"
    assert not _actor_threads(sid)

    folder = tmp_path / "big-agent"
    (folder / "data").mkdir(parents=True)
    (folder / "AGENT.md").write_text("You are a test agent.\n")
    count = INLINE_COPY_ENTRIES + 72
    for i in range(count):
        (folder / "data" / f"f{i:03}.txt").write_text(f"file {i}\n")
    status, body = await api.call("POST", "/api/agents", json={"name": "big", "path": str(folder)})
    assert status == 201, body
    await _warm(api)
    status, body = await api.call("POST", "/api/sessions", json={"agent": "big"})
    assert status == 201, body
    big = body["session"]["id"]
    assert _actor_threads(big)  # the copy went to the actor's thread
    status, body = await api.call("GET", f"/api/sessions/{big}/files")
    assert status == 200, body
    paths = {f["path"] for f in body["files"]}
    assert {f"data/f{i:03}.txt" for i in range(count)} <= paths and "AGENT.md" in paths
