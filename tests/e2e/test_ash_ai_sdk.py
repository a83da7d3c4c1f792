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


async def test_sdk_message_options_and_session_config(sapi: Api, fake_model: FakeModel,  # noqa: F811
                                                     tmp_path: Path) -> None:
    from uuid import UUID

    from ash_sdk.api.sessions import (  # type: ignore[import-untyped]
        patch_api_sessions_id_config,
        post_api_sessions_id_messages,
    )
    from ash_sdk.client import AuthenticatedClient  # type: ignore[import-untyped]
    from ash_sdk.models.api_error import ApiError  # type: ignore[import-untyped]
    from ash_sdk.models.patch_api_sessions_id_config_body import (  # type: ignore[import-untyped]
        PatchApiSessionsIdConfigBody,
    )
    from ash_sdk.models.patch_api_sessions_id_config_response_200 import (  # type: ignore[import-untyped]
        PatchApiSessionsIdConfigResponse200,
    )
    from ash_sdk.models.post_api_sessions_id_messages_body import (  # type: ignore[import-untyped]
        PostApiSessionsIdMessagesBody,
    )
    from ash_sdk.models.post_api_sessions_id_messages_body_thinking import (  # type: ignore[import-untyped]
        PostApiSessionsIdMessagesBodyThinking,
    )

    agent_dir = tmp_path / "opts-agent"
    agent_dir.mkdir()
    (agent_dir / "AGENT.md").write_text("You answer in JSON when asked.")
    base = str(sapi.client.make_url("")).rstrip("/")
    client = AshClient(base, token=sapi.key, timeout=60)
    generated = AuthenticatedClient(base_url=base, token=sapi.key)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fake_model.script("SDK-OPTS", [{"content": [{"type": "tool_use", "name": "StructuredOutput", "input": {"n": 7}}]}])

    def run() -> dict[str, Any]:
        client.deploy_agent("opts-agent", str(agent_dir))
        sid = str(client.create_session("opts-agent", model="m-sdk-first").id)
        events = list(client.send_message_stream(
            sid, "SDK-OPTS count", max_turns=4, effort="medium", max_budget_usd=5.0,
            thinking={"type": "enabled", "budgetTokens": 2048},
            output_format={"type": "json_schema", "schema": schema}))
        assert isinstance(events[-1], DoneEvent)
        result = [e.data for e in events if isinstance(e, MessageEvent)][-1]
        assert result["type"] == "result" and result["structured_output"] == {"n": 7}
        # the generated function: a bad option is an ApiError it parses
        bad = post_api_sessions_id_messages.sync(UUID(sid), client=generated, body=PostApiSessionsIdMessagesBody(
            content="x", thinking=PostApiSessionsIdMessagesBodyThinking(type_="enabled", budget_tokens=10)))
        assert isinstance(bad, ApiError) and bad.status_code == 400 and "budgetTokens" in bad.error
        # live config through the generated function; its answer parses as the client's model
        changed = patch_api_sessions_id_config.sync(UUID(sid), client=generated, body=PatchApiSessionsIdConfigBody(
            model="m-sdk-patched", allowed_tools=["Read"], betas=["beta-sdk"]))
        assert isinstance(changed, PatchApiSessionsIdConfigResponse200)
        assert str(changed.session.id) == sid and changed.session.status == "active"
        assert changed.session["model"] == "m-sdk-patched" and changed.session["allowedTools"] == ["Read"]
        events = list(client.send_message_stream(sid, "SDK-AFTER-PATCH hi"))
        assert isinstance(events[-1], DoneEvent)
        missing = patch_api_sessions_id_config.sync(UUID("00000000-0000-4000-8000-000000000000"), client=generated,
                                                    body=PatchApiSessionsIdConfigBody(model="m"))
        assert isinstance(missing, ApiError) and missing.status_code == 404
        return {"sid": sid}

    await asyncio.to_thread(run)
    first = fake_model.requests_containing("SDK-OPTS")[0]
    assert first["body"]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["body"]["output_config"] == {"effort": "medium"} and first["body"]["model"] == "m-sdk-first"
    after = fake_model.requests_containing("SDK-AFTER-PATCH")[0]
    assert after["body"]["model"] == "m-sdk-patched" and [t["name"] for t in after["body"]["tools"]] == ["Read"]
    assert "beta-sdk" in after["headers"]["anthropic-beta"]
