"""Every row of the session state table and every error row of sessions, through real HTTP.

One server per test function (each sandboxed server start costs about a second); the cases share
it where that keeps the story readable. Runner rows (liveness timeout, deregistration) belong to
coordinator mode and are tested there.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from ashd.storage._models import Session, new_id
from ashd.storage._sessions import Sessions, session_json
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _status(api: Api, sid: str) -> str:
    status, body = await api.call("GET", f"/api/sessions/{sid}")
    assert status == 200, body
    return str(body["session"]["status"])


async def _lifecycle(api: Api, sid: str) -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
    assert status == 200, body
    return [json.loads(e["data"]) for e in body["events"]]


async def _insert_row(api: Api, status: str) -> str:
    services = api.server.components
    assert services is not None
    sid = new_id()
    await Sessions(services.db).insert(Session(id=sid, tenant_id="default", agent_name="helper", status=status,
                                               model=None, config="{}"))
    return sid


def _metric(text: str, path: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'ash_resume_total{{path="{path}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_state_table(sapi: Api, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    await deploy(sapi)

    # starting → active (creation succeeds); lastActiveAt moves with each message
    session = await create(sapi)
    sid = session["id"]
    assert session["status"] == "active"
    before = session["lastActiveAt"]
    status, frames = await send(sapi, sid, "first message")
    assert status == 200 and frames[-1].event == "done"
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["lastActiveAt"] > before
    after_turn = body["session"]["lastActiveAt"]

    # active → resume is a no-op returning the session as is (as stored since the turn)
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    assert body["session"]["sandboxId"] == session["sandboxId"]
    assert body["session"]["lastActiveAt"] == after_turn

    # active → paused; paused → active (warm: the sandbox stayed alive)
    status, _ = await send(sapi, sid, "second message")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200 and body["session"]["status"] == "paused"
    assert body["session"]["lastActiveAt"] > after_turn  # the second turn's, not a copy from before it
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    assert body["session"]["sandboxId"] == session["sandboxId"]

    # active → stopped; stopped: pause 400, message 400, resume → cold → active
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/stop")
    assert status == 200 and body["session"]["status"] == "stopped"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 400 and "stopped" in body["error"] and body["statusCode"] == 400
    status, body = await send(sapi, sid, "while stopped")
    assert status == 400 and body[0]["error"].startswith("Session is stopped")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    assert body["session"]["sandboxId"] not in ("", session["sandboxId"])
    status, frames = await send(sapi, sid, "after cold resume")
    assert status == 200 and frames[-1].event == "done"

    # active → ended (DELETE); ended: resume 410, message 400, history stays
    status, body = await sapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "ended"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 410 and body["statusCode"] == 410
    status, body = await send(sapi, sid, "after end")
    assert status == 400 and "ended" in body[0]["error"]
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/messages")
    assert status == 200 and len(body["messages"]) >= 4
    actions = [e["action"] for e in await _lifecycle(sapi, sid)]
    assert actions == ["created", "paused", "resumed", "stopped", "resumed", "ended"]

    # paused → ended; stopped → ended
    for first in ("pause", "stop"):
        other = (await create(sapi))["id"]
        status, body = await sapi.call("POST", f"/api/sessions/{other}/{first}")
        assert status == 200
        status, body = await sapi.call("DELETE", f"/api/sessions/{other}")
        assert status == 200 and body["session"]["status"] == "ended"

    # starting → active through resume (a row left in `starting`), and starting → stopped
    starting = await _insert_row(sapi, "starting")
    status, body = await sapi.call("POST", f"/api/sessions/{starting}/resume")
    assert status == 200 and body["session"]["status"] == "active" and body["session"]["sandboxId"]
    status, frames = await send(sapi, starting, "hello from a resumed starting row")
    assert status == 200 and frames[-1].event == "done"
    starting2 = await _insert_row(sapi, "starting")
    status, body = await sapi.call("POST", f"/api/sessions/{starting2}/stop")
    assert status == 200 and body["session"]["status"] == "stopped"
    # no sandbox, no snapshot: the files endpoints say so
    status, body = await sapi.call("GET", f"/api/sessions/{starting2}/files")
    assert status == 404 and "workspace" in body["error"]
    status, body = await sapi.call("GET", f"/api/sessions/{starting2}/files/AGENT.md")
    assert status == 404

    # error → active (resume), error → ended (DELETE)
    errored = await _insert_row(sapi, "error")
    status, body = await sapi.call("POST", f"/api/sessions/{errored}/pause")
    assert status == 400 and "error" in body["error"]
    status, body = await sapi.call("POST", f"/api/sessions/{errored}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    errored2 = await _insert_row(sapi, "error")
    status, body = await sapi.call("DELETE", f"/api/sessions/{errored2}")
    assert status == 200 and body["session"]["status"] == "ended"

    # resume_hit lines and the ash_resume_total counter
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"resume_hit"' in line]
    paths = [(x["path"], x["sessionId"]) for x in lines]
    assert ("warm", sid) in paths and ("cold", sid) in paths and ("cold", starting) in paths
    assert all(x["agentName"] == "helper" and x["ts"] for x in lines)
    resp = await sapi.client.get("/metrics")
    text = await resp.text()
    assert _metric(text, "warm") >= 1 and _metric(text, "cold") >= 3


async def test_creation_failure_goes_to_error_and_resume_recovers(sapi: Api, short_tmp: Path) -> None:  # noqa: F811
    # A client's folder (`path`): a managed one would be built again from the database.
    folder = short_tmp / "helper-agent"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You are helpful.\n")
    status, body = await sapi.call("POST", "/api/agents", json={"name": "helper", "path": str(folder)})
    assert status == 201, body
    saved = folder.with_name("saved-agent")
    shutil.move(folder, saved)  # the agent folder vanished from disk: the copy into the sandbox fails
    status, body = await sapi.call("POST", "/api/sessions", json={"agent": "helper"})
    assert status == 500 and body["statusCode"] == 500
    status, body = await sapi.call("GET", "/api/sessions")
    [row] = body["sessions"]
    assert row["status"] == "error"
    events = await _lifecycle(sapi, row["id"])
    assert events[-1]["action"] == "error" and events[-1].get("reason")
    shutil.move(saved, folder)
    status, body = await sapi.call("POST", f"/api/sessions/{row['id']}/resume")
    assert status == 200 and body["session"]["status"] == "active"


async def test_error_rows(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    unknown = new_id()
    # POST /api/sessions: 400 missing agent, 404 unknown agent
    status, body = await sapi.call("POST", "/api/sessions", json={})
    assert status == 400 and "agent" in body["error"]
    status, body = await sapi.call("POST", "/api/sessions", json={"agent": "nobody"})
    assert status == 404 and body["statusCode"] == 404
    # 404 for an unknown session on every session endpoint
    for method, path in (("GET", ""), ("POST", "/pause"), ("POST", "/resume"), ("POST", "/stop"),
                         ("DELETE", ""), ("GET", "/files"), ("GET", "/files/a.txt"), ("GET", "/messages"),
                         ("GET", "/events"), ("POST", "/interrupt"), ("GET", "/stream")):
        status, body = await sapi.call(method, f"/api/sessions/{unknown}{path}")
        assert status == 404, (method, path, body)
        assert body == {"error": f"Session {unknown} not found", "statusCode": 404}
    status, body = await send(sapi, unknown, "hi")
    assert status == 404

    # another tenant's session behaves as not found, also while its actor is alive
    sid = (await create(sapi))["id"]
    other = await sapi.new_tenant_key("tenant-b")
    for method, path in (("GET", ""), ("POST", "/pause"), ("POST", "/resume"), ("POST", "/stop"),
                         ("DELETE", ""), ("GET", "/files"), ("GET", "/files/AGENT.md"), ("GET", "/messages"),
                         ("GET", "/events"), ("POST", "/interrupt"), ("GET", "/stream")):
        status, body = await sapi.call(method, f"/api/sessions/{sid}{path}", key=other)
        assert status == 404, (method, path, body)
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages", json={"content": "x"},
                                  headers=sapi.headers(other))
    assert resp.status == 404
    status, body = await sapi.call("GET", "/api/sessions", key=other)
    assert body["sessions"] == []
    assert await _status(sapi, sid) == "active"

    # interrupt with no turn running: 409
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/interrupt")
    assert status == 409 and body["statusCode"] == 409

    # a second concurrent turn: 409; interrupting the first ends it with error "interrupted", then done
    fake_model.script("slow-turn", [{"content": [{"type": "text", "text": "x" * 400}], "chunk": 1,
                                     "delay": 0.05}])
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages",
                                  json={"content": "slow-turn please", "includePartialMessages": True},
                                  headers=sapi.headers())
    assert resp.status == 200
    assert (await resp.content.readline()).startswith(b"event: message")  # the turn is running
    status, body = await send(sapi, sid, "second")
    assert status == 409 and body[0] == {"error": "A turn is already running", "statusCode": 409}
    # (pause during a turn interrupts it: test_session_conformance.py)
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/interrupt")
    assert status == 200, body
    from tests.fixtures.sse import parse_frames

    frames = parse_frames(await resp.text())
    assert [f.event for f in frames[-2:]] == ["error", "done"]
    assert frames[-2].data == {"error": "interrupted"}
    # the interrupted user text is carried into the next request: let that one be quick
    fake_model.script("slow-turn", [{"content": [{"type": "text", "text": "quick now"}]}])
    status, frames2 = await send(sapi, sid, "after interrupt")
    assert status == 200 and frames2[-1].event == "done"

    # message body errors
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/messages", json={})
    assert status == 400 and "content" in body["error"]
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/messages",
                                   json={"content": "x", "includePartialMessages": "yes"})
    assert status == 400


async def test_a_warm_resume_after_its_agent_was_deleted_is_404_and_the_session_stays_paused(
        sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    session = await create(sapi)
    sid = session["id"]
    status, _ = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200
    status, _ = await sapi.call("DELETE", "/api/agents/helper")
    assert status == 200
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert (status, body) == (404, {"error": "Agent helper not found", "statusCode": 404})
    assert await _status(sapi, sid) == "paused"
    assert [e["action"] for e in await _lifecycle(sapi, sid)] == ["created", "paused"]
    await deploy(sapi)  # deployed again: the sandbox it kept resumes warm
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["sandboxId"] == session["sandboxId"]
    assert body["session"]["status"] == "active"


async def test_a_warm_resumes_count_and_line_are_there_for_the_very_next_request(
        sapi: Api, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """A transition handled on the loop does its bookkeeping after its answer is written
    (`SessionActor._after_answer`), but before the next request is read: a monitor that reads
    /metrics and /health right after a resume finds it counted."""
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    for round_ in range(1, 4):
        status, _ = await sapi.call("POST", f"/api/sessions/{sid}/pause")
        assert status == 200
        before = _metric(await (await sapi.client.get("/metrics")).text(), "warm")
        status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
        assert status == 200 and body["session"]["status"] == "active"
        assert _metric(await (await sapi.client.get("/metrics")).text(), "warm") == before + 1
        health = await (await sapi.client.get("/health")).json()
        assert health["pool"]["resumeWarmHits"] == round_
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"resume_hit"' in line]
        assert [(x["path"], x["sessionId"]) for x in lines] == [("warm", sid)]


async def test_pauses_resumes_and_messages_at_once_keep_one_order(sapi: Api) -> None:  # noqa: F811
    """Requests sent together to one session, most of them handled on the loop while its actor is
    idle and the rest through its inbox (`actors/_inline.py`): every answer agrees with the status it
    names, and the lifecycle events stored replay as one valid sequence ending in the stored status."""
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    for round_ in range(6):
        answers = await asyncio.gather(
            sapi.call("POST", f"/api/sessions/{sid}/pause"),
            send(sapi, sid, f"message {round_}"),
            sapi.call("POST", f"/api/sessions/{sid}/resume"),
            sapi.call("GET", f"/api/sessions/{sid}"),
            sapi.call("POST", f"/api/sessions/{sid}/pause"),
            sapi.call("POST", f"/api/sessions/{sid}/resume"),
        )
        for (status, body), what in zip(answers, ("pause", "message", "resume", "get", "pause", "resume"),
                                        strict=True):
            if what == "message":
                assert status in (200, 400, 409), body
                if status == 200:
                    assert body[-1].event == "done"
                continue
            if status != 200:
                assert what == "pause" and status == 400 and "only an active session" in body["error"], body
                continue
            expected = {"pause": "paused", "resume": "active"}.get(what)
            assert expected is None or body["session"]["status"] == expected, (what, body)
    state = None
    for event in await _lifecycle(sapi, sid):
        action = event["action"]
        if action == "created":
            assert state is None
        elif action == "paused":
            assert state == "active", event
        elif action == "resumed":  # from paused; from active only when its sandbox was replaced
            assert (state == "paused" and event["path"] == "warm") or event.get("reason") == "sandbox_lost", event
        state = event["status"]
    assert state == await _status(sapi, sid)


async def test_the_view_after_a_turn_is_the_stored_row_with_a_config_changed_during_the_turn(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    # The session's actor keeps the row its turn's last batch returned rather than reading it again,
    # unless something else was stored about the session meanwhile (here a config change during the
    # turn): either way, the view after the turn is the row as stored, and during it too.
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    services = sapi.server.components
    assert services is not None

    async def stored() -> dict[str, Any]:
        return session_json(await Sessions(services.db).get("default", sid))

    for turn in range(2):
        status, frames = await send(sapi, sid, f"plain turn {turn}")
        assert status == 200 and frames[-1].event == "done"
        status, body = await sapi.call("GET", f"/api/sessions/{sid}")
        assert status == 200 and body["session"] == await stored()

    before_turn = body["session"]["lastActiveAt"]
    fake_model.script("VIEW-SLOW", [{"content": [{"type": "text", "text": "slow"}], "wait": 0.6}])
    running = asyncio.create_task(send(sapi, sid, "VIEW-SLOW turn"))
    await asyncio.sleep(0.3)
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")  # mid-turn: the user message moved it
    assert body["session"] == await stored() and body["session"]["lastActiveAt"] > before_turn
    status, body = await sapi.call("PATCH", f"/api/sessions/{sid}/config", json={"allowedTools": ["Read"]})
    assert status == 200, body
    status, frames = await running
    assert status == 200 and frames[-1].event == "done"
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["allowedTools"] == ["Read"]
    assert body["session"] == await stored()
    before = body["session"]["lastActiveAt"]
    status, frames = await send(sapi, sid, "after the change")
    assert status == 200 and frames[-1].event == "done", (status, frames)
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["lastActiveAt"] > before and body["session"] == await stored()
