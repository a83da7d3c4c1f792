"""Model traffic from inside a real sandbox, through the Bash tool, straight to /run/ashd/model.sock:
metered, limited and audited by the server (issue 16). A real server, sandboxes, bridge and engine,
SQLite and PostgreSQL; the fake model reports chosen usage numbers.

Each test runs a turn whose first model reply asks for a Bash command that runs `call_model.py` in
the workspace: N direct POST /v1/messages calls (streamed and plain, alternating) that print their
statuses. The engine's own calls of the turn go through the same proxy.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.sse import Frame, parse_frames

pytestmark = pytest.mark.sandbox

CALL_MODEL = '''
import http.client, json, socket, sys

class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect("/run/ashd/model.sock")

model, max_tokens, count, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
results = []
for i in range(count):
    body = {"model": model, "max_tokens": max_tokens, "stream": i % 2 == 1,
            "messages": [{"role": "user", "content": token}]}
    conn = UnixConnection("model-proxy", timeout=120)
    conn.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json", "x-api-key": "x"})
    resp = conn.getresponse()
    resp.read()
    results.append([resp.status, resp.getheader("x-ashd-refusal")])
    conn.close()
print("RESULTS " + json.dumps(results))
'''
OPUS = "claude-opus-4-1"
SESSION_MODEL = "claude-sonnet-4-5"  # the engine's default: the model of these sessions' turns
BIG = {"input_tokens": 100_000, "output_tokens": 50_000}  # $5.25 a call at opus prices
Start = Callable[..., Awaitable[Api]]


@pytest.fixture
async def start(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Start]:
    running: list[Api] = []

    async def make(deploy: bool = True, **changes: Any) -> Api:
        server, api = await start_api(aiohttp_client, settings.with_(
            zygote=True, prewarm=1, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-traffic",
            **changes))
        running.append(api)
        if deploy:
            status, body = await api.call("POST", "/api/agents", json={"name": "caller", "files": [
                {"path": "AGENT.md", "content": "You call the model yourself."},
                {"path": "call_model.py", "content": CALL_MODEL}]})
            assert status == 201, body
        return api

    try:
        yield make
    finally:
        for api in running:
            await api.client.close()
            await api.server.stop()


async def session(api: Api, key: str | None = None) -> str:
    status, body = await api.call("POST", "/api/sessions", json={"agent": "caller"}, key=key)
    assert status == 201, body
    return str(body["session"]["id"])


async def turn(api: Api, sid: str, content: str, key: str | None = None, **extra: Any) -> list[Frame]:
    resp = await api.client.post(f"/api/sessions/{sid}/messages", json={"content": content, **extra},
                                 headers=api.headers(key))
    assert resp.status == 200, await resp.text()
    frames = parse_frames(await resp.text())
    assert frames[-1].event == "done"
    return frames


async def direct_calls(api: Api, fake_model: FakeModel, sid: str, token: str, *, model: str = OPUS,
                       max_tokens: int = 64000, count: int = 5, key: str | None = None,
                       **extra: Any) -> tuple[list[list[Any]], list[Frame]]:
    """One turn whose Bash tool makes `count` direct calls; their [status, refusal] and the frames."""
    fake_model.script(f"{token}-DIRECT", [{"content": [{"type": "text", "text": "spent"}], "usage": BIG}])
    command = f"{sys.executable} -I /workspace/call_model.py {model} {max_tokens} {count} {token}-DIRECT"
    fake_model.script(f"{token}-TURN", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": command}}]},
        {"content": [{"type": "text", "text": "turn done"}]},
    ])
    frames = await turn(api, sid, f"{token}-TURN go", key=key, **extra)
    outputs = [b["content"] for f in frames if f.event == "message" and f.data["type"] == "user"
               for b in f.data["message"]["content"] if b["type"] == "tool_result"]
    text = "".join(c if isinstance(c, str) else "".join(x.get("text", "") for x in c) for c in outputs)
    assert "RESULTS " in text, text
    return json.loads(text.split("RESULTS ", 1)[1].splitlines()[0]), frames


async def audit(api: Api, sid: str, key: str | None = None) -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/model-calls", key=key)
    assert status == 200, body
    return list(body["modelCalls"])


async def stats(api: Api, sid: str) -> dict[str, Any]:
    status, body = await api.call("GET", "/api/usage/stats", params={"sessionId": sid})
    assert status == 200, body
    return dict(body["stats"])


def errors(frames: list[Frame]) -> list[str]:
    return [str(f.data["error"]) for f in frames if f.event == "error"]


async def metrics(api: Api) -> str:
    resp = await api.client.get("/metrics")
    return await resp.text()


async def test_direct_calls_for_another_model_are_refused_by_default(start: Start, fake_model: FakeModel) -> None:
    api = await start()
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-DEFAULT")
    assert results == [[403, "model"]] * 5
    assert errors(frames) == []  # the engine's own calls (the session's model) went on
    assert [r for r in fake_model.requests if r["body"].get("model") == OPUS] == []
    calls = await audit(api, sid)
    refused = [c for c in calls if c["outcome"] == "refused"]
    assert [(c["model"], c["status"], c["reason"]) for c in refused] == [(OPUS, 403, "model")] * 5
    engine = [c for c in calls if c["outcome"] == "ok"]
    assert len(engine) == 2 and {c["model"] for c in engine} == {SESSION_MODEL}
    usage = await stats(api, sid)
    assert usage["totalInputTokens"] == sum(c["inputTokens"] for c in engine) > 0
    assert usage["totalOutputTokens"] == sum(c["outputTokens"] for c in engine) > 0
    assert f'ash_model_refusals_total{{model="{OPUS}",reason="model"}} 5.0' in await metrics(api)


async def test_allowed_direct_calls_are_all_metered_and_audited(start: Start, fake_model: FakeModel,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    api = await start(model_allow="claude-opus-*", model_max_tokens=64000, debug_timing=True)
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-ALLOWED")
    assert results == [[200, None]] * 5
    assert errors(frames) == []
    usage = await stats(api, sid)
    assert usage["totalInputTokens"] > 5 * 100_000 and usage["totalOutputTokens"] > 5 * 50_000
    calls = await audit(api, sid)
    direct = [c for c in calls if c["model"] == OPUS]
    assert len(direct) == 5
    assert [c["stream"] for c in direct] == [False, True, False, True, False]
    for c in direct:
        assert (c["inputTokens"], c["outputTokens"], c["status"], c["outcome"]) == (100_000, 50_000, 200, "ok")
        assert c["costUsd"] == pytest.approx(5.25)  # opus: $15/M input, $75/M output
        assert c["tenantId"] == "default" and c["sessionId"] == sid and c["agentName"] == "caller"
    assert [c["sequence"] for c in calls] == list(range(1, len(calls) + 1))
    assert usage["totalInputTokens"] == sum(c["inputTokens"] for c in calls)
    assert usage["totalOutputTokens"] == sum(c["outputTokens"] for c in calls)
    assert usage["totalMessages"] == 1 and usage["totalToolCalls"] == 1
    status, body = await api.call("GET", "/api/usage", params={"sessionId": sid, "limit": "1000"})
    cost = sum(e["value"] for e in body["events"] if e["eventType"] == "cost_usd")
    assert cost == pytest.approx(sum(c["costUsd"] for c in calls))
    text = await metrics(api)
    assert f'ash_model_requests_total{{model="{OPUS}",outcome="ok"}} 5.0' in text
    assert f'ash_model_tokens_total{{model="{OPUS}",type="input"}} 500000.0' in text
    # paging like the other lists
    status, body = await api.call("GET", f"/api/sessions/{sid}/model-calls", params={"limit": "2", "after": "2"})
    assert [c["sequence"] for c in body["modelCalls"]] == [3, 4]
    # the timing line has the turn's model time: every call of the turn, the direct ones included
    timing = [json.loads(line) for line in capsys.readouterr().err.splitlines()
              if '"timing"' in line and sid in line]
    assert len(timing) == 1 and timing[0]["modelCalls"] == 7 and timing[0]["modelMs"] > 0


async def test_audit_is_tenant_scoped(start: Start, fake_model: FakeModel) -> None:
    api = await start()
    sid = await session(api)
    other = await api.new_tenant_key("acme")
    status, body = await api.call("GET", f"/api/sessions/{sid}/model-calls", key=other)
    assert (status, body["statusCode"]) == (404, 404)
    for params in ({"limit": "0"}, {"after": "x"}):
        status, _ = await api.call("GET", f"/api/sessions/{sid}/model-calls", params=params)
        assert status == 400


async def test_max_tokens_above_the_ceiling_is_refused(start: Start, fake_model: FakeModel) -> None:
    api = await start()
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-MAXTOK", model=SESSION_MODEL, count=2)
    assert results == [[400, "max_tokens"]] * 2
    assert errors(frames) == []
    assert [r for r in fake_model.requests if r["body"].get("max_tokens") == 64000] == []


async def test_the_request_rate_is_limited_per_session(start: Start, fake_model: FakeModel) -> None:
    # A burst of 3: the engine's first call takes one, two direct calls pass, the rest wait a minute.
    api = await start(model_rate_per_minute=1.0, model_rate_burst=3)
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-RATE", model=SESSION_MODEL, max_tokens=1000,
                                         count=4)
    assert results == [[200, None], [200, None], [429, "rate"], [429, "rate"]]
    # the engine's next call is refused too: a wait this long is told to the person, not sat out
    (error,) = errors(frames)
    assert "refused by the server (429)" in error and "SERVICE_MODEL_RATE" in error


async def test_the_session_budget(start: Start, fake_model: FakeModel) -> None:
    api = await start(model_allow="claude-opus-*", model_max_tokens=64000, model_session_budget_usd=1.0)
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-SBUDGET", count=3)
    assert results == [[200, None], [402, "session_budget"], [402, "session_budget"]]
    (error,) = errors(frames)
    assert "(402)" in error and "this session's model budget of $1.00 is used up" in error
    # still used up in the next turn: the session's spend is what was stored
    frames = await turn(api, sid, "T-SBUDGET-AGAIN")
    assert len(errors(frames)) == 1 and "session's model budget" in errors(frames)[0]


async def test_the_tenant_budget(start: Start, fake_model: FakeModel) -> None:
    api = await start(model_allow="claude-opus-*", model_max_tokens=64000, model_tenant_budget_usd=1.0)
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-TBUDGET", count=3)
    assert results == [[200, None], [402, "tenant_budget"], [402, "tenant_budget"]]
    assert "tenant 'default' has used its model budget of $1.00" in errors(frames)[0]
    # another session of the same tenant cannot call the model this month either
    frames = await turn(api, await session(api), "T-TBUDGET-OTHER-SESSION")
    assert len(errors(frames)) == 1 and "UTC calendar month" in errors(frames)[0]
    # another tenant's budget is its own
    acme = await api.new_tenant_key("acme")
    status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "caller", "systemPrompt": "Hi."})
    assert status == 201, body
    frames = await turn(api, await session(api, key=acme), "T-TBUDGET-ACME", key=acme)
    assert errors(frames) == []


async def test_max_budget_usd_of_a_message(start: Start, fake_model: FakeModel) -> None:
    api = await start(model_allow="claude-opus-*", model_max_tokens=64000)
    sid = await session(api)
    results, frames = await direct_calls(api, fake_model, sid, "T-MSGBUDGET", count=3, maxBudgetUsd=1)
    assert results == [[200, None], [402, "turn_budget"], [402, "turn_budget"]]
    (error,) = errors(frames)
    assert "maxBudgetUsd of $1.00 is used up" in error
    frames = await turn(api, sid, "T-MSGBUDGET-NEXT")  # the next message has no budget of its own
    assert errors(frames) == []
    status, body = await api.call("POST", f"/api/sessions/{sid}/messages",
                                  json={"content": "x", "maxBudgetUsd": -1})
    assert (status, body["statusCode"]) == (400, 400) and "maxBudgetUsd" in body["error"]


async def test_two_servers_on_one_database_share_records_and_the_tenant_budget(
        start: Start, fake_model: FakeModel, short_tmp: Any) -> None:
    # Two servers (own data dirs and sandboxes) on one database, as several coordinators or runners.
    policy = {"model_allow": "claude-opus-*", "model_max_tokens": 64000, "model_tenant_budget_usd": 1.0,
              "api_key": "ashd-shared-test-key"}
    first = await start(**policy)
    second = await start(deploy=False, data_dir=str(short_tmp / "second"), **policy)
    sid = await session(first)
    results, _ = await direct_calls(first, fake_model, sid, "T-SHARED", count=2)
    assert results == [[200, None], [402, "tenant_budget"]]
    # the second server sees the first one's records, and the tenant's spend with them
    calls = await audit(second, sid)
    assert [c["model"] for c in calls if c["outcome"] == "ok"].count(OPUS) == 1
    assert all(c["server"] for c in calls)  # which server's proxy saw each call
    frames = await turn(second, await session(second), "T-SHARED-SECOND-SERVER")
    assert len(errors(frames)) == 1 and "tenant 'default' has used its model budget" in errors(frames)[0]
