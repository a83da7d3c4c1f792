"""ModelProxy on a Unix socket in front of the fake model: key swap, allowlist, streaming, metering,
the policy's refusals and what gets recorded. Records go to an in-memory store here; the tests
through a real server and database are in tests/e2e/test_model_traffic.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from ashd.devtools.fake_model import FakeModel
from ashd.pricing import Price, PriceTable
from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, SessionModels
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.storage import ModelCallRecord

MODEL = "claude-sonnet-4-5"
# $1 per million input tokens, $10 per million output: easy sums.
PRICES = PriceTable((("*", Price(1.0, 10.0, 1.0, 0.1)),))
BIG = {"input_tokens": 100_000, "output_tokens": 50_000}  # $0.10 + $0.50 = $0.60 a call


@dataclass
class Harness:
    proxy: ModelProxy
    client: httpx2.AsyncClient
    stored: list[ModelCallRecord] = field(default_factory=list)
    spend: dict[str, float] = field(default_factory=dict)  # stored spend per session/tenant (storage stand-in)

    async def post(self, body: dict[str, Any], path: str = "/v1/messages", **kw: Any) -> httpx2.Response:
        return await self.client.post(f"http://model-proxy{path}", json=body, **kw)

    async def records(self) -> list[ModelCallRecord]:
        await self.proxy.flush()
        return list(self.stored)


def body(token: str, *, model: str = MODEL, max_tokens: int = 1000, stream: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens,
                           "messages": [{"role": "user", "content": f"{token} hi"}]}
    if stream:
        out["stream"] = True
    return out


async def start(fake_model: FakeModel, policy: ModelPolicy, *, bind: bool = True,
                turn: bool = True, budget: float | None = None) -> tuple[Harness, Path]:
    run = Path(tempfile.mkdtemp(prefix="ashd-mp-", dir="/tmp"))
    stored: list[ModelCallRecord] = []
    spend: dict[str, float] = {}

    async def store(records: Sequence[ModelCallRecord]) -> None:
        stored.extend(records)

    async def session_spend(session_id: str) -> float:
        return spend.get(session_id, 0.0) + sum(r.cost_usd for r in stored if r.session_id == session_id)

    async def tenant_spend(tenant: str, since: Any) -> float:
        return spend.get(tenant, 0.0) + sum(r.cost_usd for r in stored if r.tenant == tenant)

    proxy = ModelProxy(fake_model.url, policy=policy, store=store, session_spend=session_spend,
                       tenant_spend=tenant_spend, server_id="test")
    await proxy.start_for("sb1", run / "model.sock")
    if bind:
        proxy.bind("sb1", ModelBinding("s1", "acme", "agent", SessionModels(MODEL, ("claude-haiku-*",)),
                                       key=lambda: "sk-bound"))
    if turn:
        proxy.begin_turn("sb1", "q-1", None, budget)
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(run / "model.sock")))
    return Harness(proxy, client, stored, spend), run


@pytest.fixture
async def proxied(fake_model: FakeModel) -> AsyncIterator[Harness]:
    h, run = await start(fake_model, ModelPolicy(prices=PRICES))
    try:
        yield h
    finally:
        await h.client.aclose()
        await h.proxy.close()
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture
async def make(fake_model: FakeModel) -> AsyncIterator[Any]:
    made: list[tuple[Harness, Path]] = []

    async def factory(policy: ModelPolicy, **kw: Any) -> Harness:
        made.append(await start(fake_model, policy, **kw))
        return made[-1][0]

    try:
        yield factory
    finally:
        for h, run in made:
            await h.client.aclose()
            await h.proxy.close()
            shutil.rmtree(run, ignore_errors=True)


async def test_key_is_replaced_and_stream_passes_through(proxied: Harness, fake_model: FakeModel) -> None:
    keys = iter(["sk-first", "sk-second"])
    proxied.proxy.set_key_provider("sb1", lambda: next(keys))
    headers = {"x-api-key": "sandbox-no-key", "authorization": "Bearer leaked", "anthropic-version": "2023-06-01",
               "content-type": "application/json"}
    streamed = json.dumps(body("PROXY-1", stream=True)).encode()
    plain = json.dumps(body("PROXY-1")).encode()
    resp = await proxied.client.post("http://model-proxy/v1/messages", content=streamed, headers=headers)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert "event: message_stop" in resp.text
    resp = await proxied.client.post("http://model-proxy/v1/messages", content=plain, headers=headers)
    assert resp.json()["content"][0]["text"] == "echo: PROXY-1 hi"
    seen = fake_model.requests_containing("PROXY-1")
    assert [r["headers"]["x-api-key"] for r in seen] == ["sk-first", "sk-second"]
    assert all("authorization" not in r["headers"] for r in seen)
    assert seen[0]["headers"]["anthropic-version"] == "2023-06-01"
    stats = proxied.proxy.stats("sb1")
    assert stats.requests == 2
    assert stats.bytes_out > 0


async def test_usage_is_metered_from_streams_and_json_bodies(proxied: Harness, fake_model: FakeModel) -> None:
    fake_model.script("METER-1", [{"content": [{"type": "text", "text": "x" * 300}],
                                   "usage": {**BIG, "cache_creation_input_tokens": 7, "cache_read_input_tokens": 9}}])
    streamed = await proxied.post(body("METER-1", stream=True))
    plain = await proxied.post(body("METER-1"))
    count = await proxied.post(body("METER-1"), path="/v1/messages/count_tokens")
    assert (streamed.status_code, plain.status_code, count.status_code) == (200, 200, 200)
    records = await proxied.records()
    assert [(r.endpoint, r.stream, r.outcome) for r in records] == [
        ("messages", True, "ok"), ("messages", False, "ok"), ("count_tokens", False, "ok")]
    for r in records[:2]:
        assert (r.input_tokens, r.output_tokens, r.cache_creation_tokens, r.cache_read_tokens) == (100_000, 50_000, 7, 9)
        assert r.cost_usd == pytest.approx(0.6 + 7e-6 + 9e-7)
        assert (r.session_id, r.tenant, r.agent_name, r.model, r.query_id) == ("s1", "acme", "agent", MODEL, "q-1")
        assert r.status == 200 and r.latency_ms > 0 and r.first_byte_ms is not None
    assert records[2].input_tokens == 0 and records[2].cost_usd == 0
    summary = proxied.proxy.end_turn("sb1", "q-1")
    assert summary.calls == 3 and summary.cost_usd == pytest.approx(records[0].cost_usd * 2)


async def test_upstream_errors_are_recorded_with_their_type(proxied: Harness, fake_model: FakeModel) -> None:
    fake_model.script("METER-ERR", [{"error": {"status": 529, "message": "busy"}}])
    resp = await proxied.post(body("METER-ERR", stream=True))
    assert resp.status_code == 529
    (rec,) = await proxied.records()
    assert (rec.outcome, rec.reason, rec.status, rec.cost_usd) == ("error", "overloaded_error", 529, 0)


async def test_only_messages_endpoints_are_forwarded(proxied: Harness) -> None:
    resp = await proxied.client.get("http://model-proxy/v1/models")
    assert resp.status_code == 404
    assert resp.json()["type"] == "error"
    assert resp.headers["x-ashd-refusal"] == "not_forwarded"
    count = await proxied.post(body("PROXY-2"), path="/v1/messages/count_tokens")
    assert count.status_code == 200
    assert count.json()["input_tokens"] > 0


async def test_no_key_is_an_anthropic_shaped_401(proxied: Harness) -> None:
    proxied.proxy.set_key_provider("sb1", lambda: None)
    resp = await proxied.post(body("PROXY-3"))
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"


async def test_async_key_provider(proxied: Harness, fake_model: FakeModel) -> None:
    async def provider() -> str:
        return "sk-async"

    proxied.proxy.set_key_provider("sb1", provider)
    resp = await proxied.post(body("PROXY-4"))
    assert resp.status_code == 200
    assert fake_model.requests_containing("PROXY-4")[-1]["headers"]["x-api-key"] == "sk-async"


def refusal(resp: httpx2.Response, status: int, error_type: str, reason: str) -> str:
    assert resp.status_code == status, resp.text
    payload = resp.json()
    assert payload["type"] == "error" and payload["error"]["type"] == error_type
    assert resp.headers["x-ashd-refusal"] == reason
    return str(payload["error"]["message"])


async def test_another_model_is_refused_unless_allowed(proxied: Harness, fake_model: FakeModel) -> None:
    message = refusal(await proxied.post(body("POL-MODEL", model="claude-opus-4-1")), 403, "permission_error", "model")
    assert "claude-opus-4-1" in message and "SERVICE_MODEL_ALLOW" in message and "allowedModels" in message
    assert (await proxied.post(body("POL-MODEL", model="claude-haiku-4-5"))).status_code == 200  # agent allows
    proxied.proxy.end_turn("sb1", "q-1")
    proxied.proxy.begin_turn("sb1", "q-2", "claude-opus-4-1", None)  # the message asked for opus
    assert (await proxied.post(body("POL-MODEL", model="claude-opus-4-1"))).status_code == 200
    refusal(await proxied.post(body("POL-MODEL")), 403, "permission_error", "model")  # now sonnet is not the turn's
    assert len(fake_model.requests_containing("POL-MODEL")) == 2
    records = await proxied.records()
    assert [(r.model, r.outcome, r.reason) for r in records] == [
        ("claude-opus-4-1", "refused", "model"), ("claude-haiku-4-5", "ok", None),
        ("claude-opus-4-1", "ok", None), (MODEL, "refused", "model")]


async def test_operator_allow_list(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(allow=("claude-opus-*",), prices=PRICES))
    assert (await h.post(body("POL-ALLOW", model="claude-opus-4-1"))).status_code == 200


async def test_max_tokens_above_the_ceiling_is_refused(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(max_tokens=16000, prices=PRICES))
    message = refusal(await h.post(body("POL-MAX", max_tokens=64000)), 400, "invalid_request_error", "max_tokens")
    assert "16000" in message and "SERVICE_MODEL_MAX_TOKENS" in message
    assert (await h.post(body("POL-MAX", max_tokens=16000))).status_code == 200
    assert len(fake_model.requests_containing("POL-MAX")) == 1


async def test_request_rate_per_session(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(rate_per_minute=1, rate_burst=2, prices=PRICES))
    assert (await h.post(body("POL-RATE"))).status_code == 200
    assert (await h.post(body("POL-RATE"))).status_code == 200
    third = await h.post(body("POL-RATE"))
    refusal(third, 429, "rate_limit_error", "rate")
    assert int(third.headers["retry-after"]) >= 1
    assert len(fake_model.requests_containing("POL-RATE")) == 2


async def test_turn_budget(make: Any, fake_model: FakeModel) -> None:
    fake_model.script("POL-TURN", [{"content": [{"type": "text", "text": "spent"}], "usage": BIG}])
    h = await make(ModelPolicy(prices=PRICES), budget=1.0)
    assert (await h.post(body("POL-TURN"))).status_code == 200  # $0.60
    assert (await h.post(body("POL-TURN"))).status_code == 200  # $1.20: past the budget now
    message = refusal(await h.post(body("POL-TURN")), 402, "billing_error", "turn_budget")
    assert "maxBudgetUsd" in message and "$1.00" in message
    h.proxy.end_turn("sb1", "q-1")
    h.proxy.begin_turn("sb1", "q-2", None, 1.0)  # a new message has a budget of its own
    assert (await h.post(body("POL-TURN"))).status_code == 200


async def test_session_budget_counts_stored_spend(make: Any, fake_model: FakeModel) -> None:
    fake_model.script("POL-SESSION", [{"content": [{"type": "text", "text": "spent"}], "usage": BIG}])
    h = await make(ModelPolicy(session_budget_usd=2.0, prices=PRICES))
    h.spend["s1"] = 1.5  # spent by this session before (another sandbox, another process)
    assert (await h.post(body("POL-SESSION"))).status_code == 200
    message = refusal(await h.post(body("POL-SESSION")), 402, "billing_error", "session_budget")
    assert "SERVICE_MODEL_SESSION_BUDGET_USD" in message
    h.proxy.end_turn("sb1", "q-1")
    h.proxy.begin_turn("sb1", "q-2", None, None)
    refusal(await h.post(body("POL-SESSION")), 402, "billing_error", "session_budget")


async def test_tenant_budget_with_spend_of_other_servers(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(tenant_budget_usd=100.0, tenant_budgets={"acme": 5.0}, prices=PRICES))
    h.spend["acme"] = 5.0  # spent this month through other servers sharing the database
    message = refusal(await h.post(body("POL-TENANT")), 402, "billing_error", "tenant_budget")
    assert "acme" in message and "UTC calendar month" in message and "SERVICE_MODEL_TENANT_BUDGET" in message
    assert fake_model.requests_containing("POL-TENANT") == []


async def test_concurrent_calls_cannot_all_slip_under_a_budget(make: Any, fake_model: FakeModel) -> None:
    fake_model.script("POL-RACE", [{"content": [{"type": "text", "text": "slow"}], "usage": BIG, "delay": 0.02}])
    # Worst case of one call: 10,000 output tokens at $10/M = $0.10 plus its input: once one call is in
    # flight, nothing is left of the $0.10 budget for the others.
    h = await make(ModelPolicy(prices=PRICES), budget=0.1)
    replies = await asyncio.gather(*(h.post(body("POL-RACE", max_tokens=10_000, stream=True)) for _ in range(8)))
    assert sorted(r.status_code for r in replies) == [200] + [402] * 7


async def test_calls_outside_a_turn_or_a_session_are_refused(make: Any, fake_model: FakeModel) -> None:
    between = await make(ModelPolicy(prices=PRICES), turn=False)
    message = refusal(await between.post(body("POL-TURNLESS")), 403, "permission_error", "no_turn")
    assert "no turn is running" in message
    unclaimed = await make(ModelPolicy(prices=PRICES), bind=False)
    refusal(await unclaimed.post(body("POL-TURNLESS")), 403, "permission_error", "no_session")
    assert fake_model.requests_containing("POL-TURNLESS") == []
    assert [r.reason for r in await between.records()] == ["no_turn"]
    assert await unclaimed.records() == []


async def test_the_checked_body_is_the_forwarded_body(proxied: Harness, fake_model: FakeModel) -> None:
    raw = json.dumps(body("POL-BYTES"), indent=2).encode()
    resp = await proxied.client.post("http://model-proxy/v1/messages", content=raw,
                                     headers={"content-type": "application/json", "accept-encoding": "gzip"})
    assert resp.status_code == 200
    (seen,) = fake_model.requests_containing("POL-BYTES")
    assert seen["body"] == json.loads(raw)
    assert seen["headers"].get("accept-encoding") == "identity"  # the proxy must be able to read the usage
    long = body("POL-LONG") | {"system": "z" * 400_000}  # parsed off the loop, forwarded all the same
    assert (await proxied.post(long)).status_code == 200
    assert fake_model.requests_containing("POL-LONG")[0]["body"] == long
    # A second `model` key (also spelt with an escape) could show the proxy one model and the API another.
    for dup in (b'{"model": "claude-opus-4-1", "max_tokens": 10, "messages": [], "model": "' + MODEL.encode() + b'"}',
                b'{"model": "' + MODEL.encode() + b'", "max_tokens": 10, "messages": [], "mod\\u0065l": "x"}'):
        message = refusal(await proxied.client.post("http://model-proxy/v1/messages", content=dup),
                          400, "invalid_request_error", "invalid")
        assert "twice" in message
    for bad in (b"not json", b"[1]", b'{"model": 5, "max_tokens": 1, "messages": []}',
                b'{"model": "m", "max_tokens": true, "messages": []}', b'{"model": "m"} {}', b"\xff\xfe{}",
                b'{"model": "m", "max_tokens": 1, "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        resp = await proxied.client.post("http://model-proxy/v1/messages", content=bad)
        refusal(resp, 400, "invalid_request_error", "invalid")
    huge = b'{"model": "m", "max_tokens": 1, "messages": "' + b"x" * (33 * 1024 * 1024) + b'"}'
    refusal(await proxied.client.post("http://model-proxy/v1/messages", content=huge), 413, "request_too_large",
            "invalid")


async def test_an_abandoned_stream_is_still_billed(proxied: Harness, fake_model: FakeModel) -> None:
    text = "y" * 3000
    fake_model.script("ABANDON", [{"content": [{"type": "text", "text": text}], "usage": BIG, "delay": 0.01}])
    async with proxied.client.stream("POST", "http://model-proxy/v1/messages",
                                     json=body("ABANDON", stream=True)) as resp:
        async for line in resp.aiter_lines():
            if "content_block_delta" in line:
                break  # the sandbox hangs up mid-reply
    for _ in range(200):
        records = await proxied.records()
        if records:
            break
        await asyncio.sleep(0.05)
    (rec,) = records
    assert rec.outcome == "aborted" and rec.input_tokens == 100_000
    assert 1 <= rec.output_tokens < 50_000  # estimated from what was generated before the hang-up
    assert rec.cost_usd >= 0.1


async def test_refusal_records_are_bounded(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(prices=PRICES), turn=False)
    for _ in range(70):
        await h.post(body("POL-FLOOD"))
    records = await h.records()
    assert len(records) == 60
    h.proxy._bound["sb1"].refusal_log.at -= 1.0  # a second passes: the log has room for one more row
    await h.post(body("POL-FLOOD"))
    last = (await h.records())[-1]
    assert "more refusals not listed" in (last.detail or "")
