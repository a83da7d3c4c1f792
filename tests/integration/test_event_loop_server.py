"""A real `python -m ashd serve` on each event loop `SERVICE_EVENT_LOOP` offers: the loop it says
it runs is the one asked for, a whole session's life works on it, and it stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames

pytestmark = pytest.mark.sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _call(http: aiohttp.ClientSession, url: str, key: str, method: str, path: str,
                **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url + path, headers={"Authorization": f"Bearer {key}"}, **kw) as resp:
        text = await resp.text()
        if resp.content_type == "text/event-stream":
            return resp.status, parse_frames(text)
        return resp.status, json.loads(text)


@pytest.mark.parametrize(("choice", "runs"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_a_session_lives_on_the_loop_the_setting_names(choice: str, runs: str, settings: Settings,
                                                             fake_model: FakeModel,  # noqa: F811
                                                             tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SERVICE_DATA_DIR": settings.data_dir, "SERVICE_PORT": str(port),
           "SERVICE_HOST": "127.0.0.1", "SERVICE_DATABASE_URL": settings.effective_database_url,
           "SERVICE_PREWARM": "1", "ANTHROPIC_BASE_URL": fake_model.url, "ANTHROPIC_API_KEY": "x",
           "SERVICE_EVENT_LOOP": choice}
    fake_model.script("loop-check", [{"content": [{"type": "text", "text": f"answered on {runs}"}]}])
    log = tmp_path / "server.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ashd", "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while True:
                    assert proc.poll() is None, log.read_text()
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(url + "/health") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.1)
            key = (Path(settings.data_dir) / "initial-api-key").read_text().strip()
            status, body = await _call(http, url, key, "POST", "/api/agents",
                                       json={"name": "looped", "systemPrompt": "You answer."})
            assert status == 201, body
            status, body = await _call(http, url, key, "POST", "/api/sessions", json={"agent": "looped"})
            assert status == 201, body
            sid = body["session"]["id"]
            status, frames = await _call(http, url, key, "POST", f"/api/sessions/{sid}/messages",
                                         json={"content": "loop-check"})
            assert status == 200 and frames[-1].event == "done", frames
            assert f"answered on {runs}" in json.dumps([f.data for f in frames if f.event == "message"])
            for action, after in (("pause", "paused"), ("resume", "active")):
                status, body = await _call(http, url, key, "POST", f"/api/sessions/{sid}/{action}")
                assert status == 200 and body["session"]["status"] == after, body
            status, body = await _call(http, url, key, "GET", f"/api/sessions/{sid}/messages")
            assert status == 200 and [m["role"] for m in body["messages"]] == ["user", "assistant", "assistant"]
            status, body = await _call(http, url, key, "DELETE", f"/api/sessions/{sid}")
            assert status == 200 and body["session"]["status"] == "ended", body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    listening = [line for line in lines if line.get("msg") == "listening"]
    assert [line.get("eventLoop") for line in listening] == [runs], lines
    assert not [line for line in lines if line.get("level") in ("error", "critical")], lines
