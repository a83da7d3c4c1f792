"""What decisions.md fixes where the interface is silent, through real sandboxes and HTTP: pause while a
turn runs, a message to an ended session, event paging past internal rows, tool names on tool results,
and a turn's compute seconds taken from the sandbox's CPU accounting."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from typing import Any

import asyncpg
import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames
from tests.integration.test_interrupted_turns import CUT, NEXT, assert_cut_turn_not_replayed, script_cut_turn, until
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _events(api: Api, sid: str, query: str = "") -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events{query}")
    assert status == 200, body
    return list(body["events"])


async def test_pause_while_a_turn_runs_interrupts_it_stores_it_then_pauses(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    script_cut_turn(fake_model)
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages", json={"content": f"{CUT} please"},
                                  headers=sapi.headers())

    async def second_model_call() -> bool:
        return len(fake_model.requests_containing(CUT)) >= 2

    await until(second_model_call, "the model to be streaming the turn's reply")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200, body
    assert body["session"]["status"] == "paused"

    frames = parse_frames((await resp.content.read()).decode())
    assert [f.event for f in frames][-2:] == ["error", "done"]
    assert frames[-2].data["error"] == "interrupted: session paused"
    # Stored before the pause: the interruption comes before the `paused` lifecycle event.
    events = await _events(sapi, sid)
    kinds = [(e["type"], json.loads(e["data"]) if e["data"] else None) for e in events]
    cut = next(i for i, (t, d) in enumerate(kinds) if t == "error" and d and d["error"] == "interrupted: session paused")
    paused = next(i for i, (t, d) in enumerate(kinds) if t == "lifecycle" and d and d["action"] == "paused")
    assert cut < paused

    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active", body
    status, frames = await send(sapi, sid, NEXT)
    assert status == 200 and frames[-1].event == "done"
    assert_cut_turn_not_replayed(fake_model)


@pytest.mark.parametrize("ending", ["stop", "delete"])
async def test_a_stop_or_delete_while_a_tool_runs_interrupts_the_turn_stores_it_then_ends(
        sapi: Api, fake_model: FakeModel, ending: str) -> None:  # noqa: F811
    # As a pause: the turn is interrupted and stored, then the workspace is snapshotted with no tool
    # of the turn still writing to it, then the sandbox goes. The tool's sleep is killed with the turn:
    # the answer does not wait for it, nor for the grace a turn that does not end would get.
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    base = f"/api/sessions/{sid}"
    token = f"END-{ending}"
    fake_model.script(token, [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo begun > begun.txt; sleep 60"}}]},
        {"content": [{"type": "text", "text": "never reached"}]},
    ])
    resp = await sapi.client.post(f"{base}/messages", json={"content": f"{token} please"}, headers=sapi.headers())

    async def tool_running() -> bool:
        return (await sapi.call("GET", f"{base}/files/begun.txt?format=json"))[0] == 200

    await until(tool_running, "the turn's tool to be running")
    status, body = await (sapi.call("POST", f"{base}/stop") if ending == "stop" else sapi.call("DELETE", base))
    assert status == 200, body
    assert body["session"]["status"] == ("stopped" if ending == "stop" else "ended")

    frames = parse_frames((await asyncio.wait_for(resp.content.read(), 30)).decode())
    assert [f.event for f in frames][-2:] == ["error", "done"]
    why = f"interrupted: session {'stopped' if ending == 'stop' else 'deleted'}"
    assert frames[-2].data["error"] == why
    events = await _events(sapi, sid)
    kinds = [(e["type"], json.loads(e["data"]) if e["data"] else None) for e in events]
    cut = next(i for i, (t, d) in enumerate(kinds) if t == "error" and d and d["error"] == why)
    end = next(i for i, (t, d) in enumerate(kinds) if t == "lifecycle" and d and d["action"] in ("stopped", "ended"))
    assert cut < end  # the turn was stored before the session's end
    status, got = await sapi.call("GET", f"{base}/files/begun.txt?format=json")  # from the final snapshot
    assert status == 200 and got["content"] == "begun\n", got
    if ending == "stop":
        status, body = await sapi.call("POST", f"{base}/resume")
        assert status == 200 and body["session"]["status"] == "active", body
        status, got = await sapi.call("GET", f"{base}/files/begun.txt?format=json")
        assert status == 200 and got["content"] == "begun\n", got


async def test_pause_of_a_session_that_is_not_active_is_400(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200, body
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 400 and body["error"] == "Session is paused; only an active session can be paused"


async def test_a_message_to_an_ended_session_says_to_create_a_new_one(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await sapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200, body
    status, frames = await send(sapi, sid, "hello")
    assert status == 400
    assert frames[0] == {"error": "Session is ended; create a new session", "statusCode": 400}
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 410, body


async def test_event_paging_counts_only_events_a_client_sees(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("page-me", [{"content": [{"type": "text", "text": "one"}]}])
    status, _ = await send(sapi, sid, "page-me")
    assert status == 200
    everything = await _events(sapi, sid, "?limit=1000")
    assert len(everything) >= 3
    # Walking one event at a time finds every event, in order: internal rows (stream frames kept for
    # replay) between them never make a page come back empty.
    walked: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await _events(sapi, sid, f"?after={after}&limit=1")
        if not page:
            break
        assert len(page) == 1
        walked.append(page[0])
        after = page[0]["sequence"]
    assert [e["id"] for e in walked] == [e["id"] for e in everything]


async def test_tool_results_name_their_tool(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("name-the-tool", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo hi"}}]},
        {"content": [{"type": "text", "text": "done"}]},
    ])
    status, frames = await send(sapi, sid, "name-the-tool")
    assert status == 200 and frames[-1].event == "done"
    starts = [json.loads(e["data"]) for e in await _events(sapi, sid, "?type=tool_start")]
    results = [json.loads(e["data"]) for e in await _events(sapi, sid, "?type=tool_result")]
    assert [s["toolName"] for s in starts] == ["Bash"]
    assert [(r["toolName"], r["toolId"]) for r in results] == [("Bash", starts[0]["toolId"])]


async def test_compute_seconds_are_the_sandboxes_cpu_time_not_the_turns_wall_time(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    # A turn that waits 3 s in a tool uses next to no CPU: wall time would count all 3 s.
    fake_model.script("wait-a-while", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "sleep 3"}}]},
        {"content": [{"type": "text", "text": "rested"}]},
    ])
    status, frames = await send(sapi, sid, "wait-a-while")
    assert status == 200 and frames[-1].event == "done"
    status, body = await sapi.call("GET", "/api/usage/stats")
    assert status == 200, body
    seconds = body["stats"]["totalComputeSeconds"]
    assert 0 < seconds < 2.0, seconds


async def test_a_turn_whose_prompt_waits_for_the_database_still_counts_the_sandboxes_cpu(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    """Another writer holds the database as the message arrives (SQLite's write lock; on PostgreSQL
    the session's row): the prompt's write waits, on SQLite's writer thread or awaited on the loop.
    The query goes to the bridge meanwhile, held: the model proxy forwards none of its calls until
    the prompt is stored. The turn's start is still read from the sandbox's CPU counter (a turn
    whose counter was never read counts its wall time)."""
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    fake_model.script("wait-for-the-writer", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "sleep 2"}}]},
        {"content": [{"type": "text", "text": "rested"}]},
    ])
    assert sapi.server.components is not None
    db = sapi.server.components.db
    path = db.sqlite_file
    if path is None:
        url = db.engine.url.render_as_string(hide_password=False).replace("postgresql+asyncpg://", "postgresql://")
        holder_conn = await asyncpg.connect(url)
        try:
            async with holder_conn.transaction():
                await holder_conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", sid)
                sending = asyncio.ensure_future(send(sapi, sid, "wait-for-the-writer"))
                await asyncio.sleep(0.5)
                assert not sending.done()  # the prompt waits for the row
                assert not fake_model.requests_containing("wait-for-the-writer")  # and so does its model call
        finally:
            await holder_conn.close()
        status, frames = await sending
        assert status == 200 and frames[-1].event == "done", frames
        status, body = await sapi.call("GET", "/api/usage/stats")
        assert status == 200 and 0 < body["stats"]["totalComputeSeconds"] < 1.5, body
        return
    holding, release = threading.Event(), threading.Event()

    def hold_the_database() -> None:
        other = sqlite3.connect(path, timeout=10, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            holding.set()
            release.wait(10)
            other.execute("COMMIT")
        finally:
            other.close()

    holder = threading.Thread(target=hold_the_database)
    holder.start()
    try:
        assert await asyncio.to_thread(holding.wait, 10)
        sending = asyncio.ensure_future(send(sapi, sid, "wait-for-the-writer"))
        await asyncio.sleep(0.3)
        assert not sending.done()  # the prompt waits for the database
        assert not fake_model.requests_containing("wait-for-the-writer")  # and so does its model call
    finally:
        release.set()
        await asyncio.to_thread(holder.join, 10)
    status, frames = await sending
    assert status == 200 and frames[-1].event == "done", frames
    status, body = await sapi.call("GET", "/api/usage/stats")
    assert status == 200, body
    assert 0 < body["stats"]["totalComputeSeconds"] < 1.5, body["stats"]
