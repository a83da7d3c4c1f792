"""A real `python -m ashd serve` on each event loop `SERVICE_EVENT_LOOP` offers: the loop it says
it runs is the one asked for, a whole session's life works on it, and it stops cleanly on SIGTERM."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from ashd.devtools.fake_model import FakeModel
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_session_restart import Proc, _call, http, proc  # noqa: F401

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize(("choice", "runs"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_a_session_lives_on_the_loop_the_setting_names(choice: str, runs: str, proc: Proc,  # noqa: F811
                                                             http: aiohttp.ClientSession,  # noqa: F811
                                                             fake_model: FakeModel,  # noqa: F811
                                                             tmp_path: Path) -> None:
    proc.env.update({"SERVICE_EVENT_LOOP": choice, "SERVICE_PREWARM": "1"})
    proc.log = tmp_path / "server.log"
    fake_model.script("loop-check", [{"content": [{"type": "text", "text": f"answered on {runs}"}]}])
    key = await proc.start()
    status, body = await _call(http, proc, key, "POST", "/api/agents",
                               json={"name": "looped", "systemPrompt": "You answer."})
    assert status == 201, body
    status, body = await _call(http, proc, key, "POST", "/api/sessions", json={"agent": "looped"})
    assert status == 201, body
    sid = body["session"]["id"]
    status, frames = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/messages",
                                 json={"content": "loop-check"})
    assert status == 200 and frames[-1].event == "done", frames
    assert f"answered on {runs}" in json.dumps([f.data for f in frames if f.event == "message"])
    for action, after in (("pause", "paused"), ("resume", "active")):
        status, body = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/{action}")
        assert status == 200 and body["session"]["status"] == after, body
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/messages")
    assert status == 200 and [m["role"] for m in body["messages"]] == ["user", "assistant", "assistant"]
    status, body = await _call(http, proc, key, "DELETE", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "ended", body
    proc.stop()  # SIGTERM; a server that does not stop in time is killed, and its exit code shows it
    assert proc.proc is not None and proc.proc.returncode == 0, proc.log.read_text()
    lines = [json.loads(line) for line in proc.log.read_text().splitlines() if line.startswith("{")]
    listening = [line for line in lines if line.get("msg") == "listening"]
    assert [line.get("eventLoop") for line in listening] == [runs], lines
    assert not [line for line in lines if line.get("level") in ("error", "critical")], lines
