"""The published Python client `ash-ai-sdk` against a real ashd: deploy, create, stream, pause,
resume and end. The SDK is synchronous (httpx); its calls run in a thread while the server runs on
the test's event loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from ash_sdk import AshClient  # type: ignore[import-untyped]
from ash_sdk.streaming import DoneEvent, MessageEvent  # type: ignore[import-untyped]

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import sapi  # noqa: F401

pytestmark = pytest.mark.sandbox


async def test_sdk_lifecycle(sapi: Api, fake_model: FakeModel, tmp_path: Path) -> None:  # noqa: F811
    agent_dir = tmp_path / "sdk-agent"
    agent_dir.mkdir()
    (agent_dir / "AGENT.md").write_text("You are helpful.")
    client = AshClient(str(sapi.client.make_url("")).rstrip("/"), token=sapi.key, timeout=60)

    def run() -> dict[str, Any]:
        agent = client.deploy_agent("sdk-agent", str(agent_dir))
        assert agent.name == "sdk-agent" and agent.version == 1
        assert [a.name for a in client.list_agents()] == ["sdk-agent"]
        session = client.create_session("sdk-agent", model="m-sdk", system_prompt="Be brief.")
        sid = str(session.id)
        assert session.status == "active"
        events = list(client.send_message_stream(sid, "hello from the sdk", include_partial_messages=True))
        assert isinstance(events[-1], DoneEvent) and events[-1].session_id == sid
        messages = [e.data for e in events if isinstance(e, MessageEvent)]
        assert any(m["type"] == "stream_event" for m in messages)
        assert messages[-1]["type"] == "result"
        assert client.pause_session(sid).status == "paused"
        assert client.resume_session(sid).status == "active"
        assert client.get_session(sid).status == "active"
        assert [str(s.id) for s in client.list_sessions(agent="sdk-agent")] == [sid]
        events = list(client.send_message_stream(sid, "second message", model="m-override"))
        assert isinstance(events[-1], DoneEvent)
        ended = client.end_session(sid)  # stop, then DELETE
        assert ended.status == "ended"
        client.delete_agent("sdk-agent")
        return {"sid": sid}

    result = await asyncio.to_thread(run)
    assert fake_model.requests_containing("hello from the sdk")[0]["body"]["model"] == "m-sdk"
    assert fake_model.requests_containing("second message")[-1]["body"]["model"] == "m-override"
    status, body = await sapi.call("GET", f"/api/sessions/{result['sid']}/events?type=lifecycle")
    actions = [json.loads(e["data"])["action"] for e in body["events"]]
    assert actions == ["created", "paused", "resumed", "stopped", "ended"]
