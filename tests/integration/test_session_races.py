"""Requests about one session from several clients at once (a UI polling while a back end stops or
deletes the session): each gets the answer of the state it met, never a 5xx for a race it cannot
see, and nothing a request was told is stored is lost to the request that raced it."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox

ROUNDS = 6


async def _statuses(api: Api, calls: list[tuple[str, str]]) -> list[tuple[str, int, Any]]:
    async def one(method: str, path: str) -> tuple[str, int, Any]:
        status, body = await api.call(method, path)
        return f"{method} {path.rsplit('/', 1)[-1]}", status, body

    return list(await asyncio.gather(*(one(m, p) for m, p in calls)))


async def test_requests_racing_a_delete_or_a_stop_get_answers_not_5xx(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    # The DELETE and the stop let the session's actor go as soon as they answer; the requests that
    # waited behind them in its inbox were answered "the service is shutting down or a component
    # stopped" (503). A turn running makes the DELETE and the stop slow enough for them to wait.
    await deploy(sapi)
    fake_model.script("race-busy", [{"delay": 0.05, "content": [{"type": "text", "text": "busy " * 100}]}])
    for i in range(ROUNDS):
        sid = (await create(sapi))["id"]
        base = f"/api/sessions/{sid}"
        turn = asyncio.ensure_future(send(sapi, sid, "race-busy"))
        await asyncio.sleep(0.2)
        ending = ("DELETE", base) if i % 2 == 0 else ("POST", f"{base}/stop")
        others = [("GET", base), ("POST", f"{base}/pause"), ("POST", f"{base}/resume"), ("POST", f"{base}/stop")] * 3
        results = await _statuses(sapi, [ending, *others])
        failed = [(what, status, body) for what, status, body in results if status >= 500]
        assert not failed, failed
        assert results[0][1] == 200, results[0]
        status, body = await sapi.call("GET", base)
        assert status == 200 and body["session"]["status"] in ("ended", "stopped", "active", "paused"), body
        await asyncio.wait_for(turn, 30)


async def test_an_upload_racing_a_stop_is_in_the_stops_snapshot_or_refused(sapi: Api) -> None:  # noqa: F811
    # An upload answered 200 wrote into the live workspace; a stop that raced it must snapshot after
    # the write, or the file is gone on the cold resume that follows. Else the upload is refused.
    await deploy(sapi)
    for i in range(ROUNDS):
        sid = (await create(sapi))["id"]
        base = f"/api/sessions/{sid}"
        content = f"upload {i}\n" * 2000
        upload = sapi.call("POST", f"{base}/files", json={"files": [{
            "path": "raced.txt", "content": base64.b64encode(content.encode()).decode(), "encoding": "base64"}]})
        stop = sapi.call("POST", f"{base}/stop")
        (up_status, up_body), (stop_status, stop_body) = await asyncio.gather(upload, stop)
        assert stop_status == 200, stop_body
        assert up_status in (200, 400), up_body
        status, body = await sapi.call("POST", f"{base}/resume")
        assert status == 200, body
        status, got = await sapi.call("GET", f"{base}/files/raced.txt?format=json")
        if up_status == 200:
            assert status == 200 and got["content"] == content, (status, str(got)[:200])
        else:
            assert "stopped" in up_body["error"]


async def test_a_command_cut_short_by_a_stop_is_a_conflict_that_says_so(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    base = f"/api/sessions/{sid}"
    running = asyncio.ensure_future(sapi.call("POST", f"{base}/exec", json={"command": "sleep 30"}))
    for _ in range(100):  # the command is running once the session's sandbox has a sleep in it
        status, body = await sapi.call("POST", f"{base}/exec", json={"command": "pgrep -c -x sleep || true"})
        if status == 200 and body["stdout"].strip() not in ("", "0"):
            break
        await asyncio.sleep(0.05)
    status, body = await sapi.call("POST", f"{base}/stop")
    assert status == 200, body
    # Resumed at once, on a new sandbox: the command's answer still says what ended it.
    assert (await sapi.call("POST", f"{base}/resume"))[0] == 200
    status, body = await asyncio.wait_for(running, 10)
    assert status == 409, body
    assert "stopped while the command ran" in body["error"]


async def test_a_pause_and_an_interrupt_meet_a_turn_whose_sandbox_a_stop_let_go(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    # A stop during a turn lets the sandbox go first; the turn ends a moment later, when its stream
    # sees its bridge gone. A resume, then a pause or an interrupt, in that moment must not ask the
    # old bridge (a broken pipe: 500); the pause waits for the turn's end.
    await deploy(sapi)
    fake_model.script("race-slow", [{"delay": 0.05, "content": [{"type": "text", "text": "slow " * 200}]}])
    for _ in range(3):
        sid = (await create(sapi))["id"]
        base = f"/api/sessions/{sid}"
        turn = asyncio.ensure_future(send(sapi, sid, "race-slow"))
        await asyncio.sleep(0.3)
        results = await _statuses(sapi, [("POST", f"{base}/stop"), ("POST", f"{base}/resume"),
                                         ("POST", f"{base}/interrupt"), ("POST", f"{base}/pause")])
        assert not [r for r in results if r[1] >= 500], results
        await asyncio.wait_for(turn, 30)


async def test_requests_about_an_ended_session_keep_no_actor_for_it(sapi: Api) -> None:  # noqa: F811
    # Each refused request once started an actor for the session and kept it: a client polling its
    # ended sessions grew the server by an actor (and a thread) per session.
    await deploy(sapi)
    registry = sapi.server.components.local.registry  # type: ignore[union-attr]
    ended = []
    for _ in range(3):
        sid = (await create(sapi))["id"]
        assert (await sapi.call("DELETE", f"/api/sessions/{sid}"))[0] == 200
        ended.append(sid)
    for sid in ended:
        base = f"/api/sessions/{sid}"
        for method, path, body in (("POST", f"{base}/pause", None), ("POST", f"{base}/resume", None),
                                   ("POST", f"{base}/stop", None), ("POST", f"{base}/exec", {"command": "true"}),
                                   ("PATCH", f"{base}/config", {"model": "m"})):
            status, answer = await sapi.call(method, path, json=body)
            assert status in (400, 410), (path, status, answer)
            # Asked while the refusal's actor retires (as a server's drain asks at its stop): an
            # actor that went meanwhile has no turn, not an error.
            assert await registry.running_count() == 0
    for _ in range(100):
        if registry.live_actors() == 0:
            break
        await asyncio.sleep(0.05)
    assert registry.live_actors() == 0
