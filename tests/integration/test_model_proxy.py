"""ModelProxy on a Unix socket in front of the fake model: key swap, allowlist, streaming, metering,
the policy's refusals and what gets recorded. Records go to an in-memory store here; the tests
through a real server and database are in tests/e2e/test_model_traffic.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from ashd.devtools.fake_model import FakeModel
from ashd.metrics import Metrics
from ashd.pricing import Price, PriceTable
from ashd.sandboxing import _model_proxy
from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, SessionModels
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.sandboxing._upstream import upstream_route
from ashd.storage import ModelCallRecord
from tests.fixtures.forward_proxy import forward_proxy

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

    async def records_once_stored(self) -> list[ModelCallRecord]:
        """The records once any is stored (a call's record follows its end)."""
        for _ in range(200):
            records = await self.records()
            if records:
                return records
            await asyncio.sleep(0.05)
        return await self.records()


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


@contextlib.asynccontextmanager
async def bound_to(upstream: str, *, budget: float | None = None, client_timeout: float = 5.0,
                   **proxy_kw: Any) -> AsyncIterator[tuple[ModelProxy, httpx2.AsyncClient, list[ModelCallRecord]]]:
    """A proxy of its own in front of `upstream` (an API that fails, each its own way): sb1 bound
    to session s1, turn q-1 begun; with a client on its socket and the records it stores."""
    run = Path(tempfile.mkdtemp(prefix="ashd-mp-", dir="/tmp"))
    stored: list[ModelCallRecord] = []

    async def store(records: Sequence[ModelCallRecord]) -> None:
        stored.extend(records)

    proxy = ModelProxy(upstream, policy=ModelPolicy(prices=PRICES), store=store, **proxy_kw)
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(run / "model.sock")),
                                timeout=client_timeout)
    try:
        await proxy.start_for("sb1", run / "model.sock")
        proxy.bind("sb1", ModelBinding("s1", "acme", "agent", SessionModels(MODEL), key=lambda: "sk-bound"))
        proxy.begin_turn("sb1", "q-1", None, budget)
        yield proxy, client, stored
    finally:
        await client.aclose()
        await proxy.close()
        shutil.rmtree(run, ignore_errors=True)


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
    message = refusal(await proxied.client.post("http://model-proxy/v1/messages", content=huge), 413,
                      "request_too_large", "invalid")
    assert f"limit of {32 * 1024 * 1024} bytes" in message  # the Messages API's own limit


async def test_an_abandoned_stream_is_still_billed(proxied: Harness, fake_model: FakeModel) -> None:
    text = "y" * 3000
    fake_model.script("ABANDON", [{"content": [{"type": "text", "text": text}], "usage": BIG, "delay": 0.01}])
    async with proxied.client.stream("POST", "http://model-proxy/v1/messages",
                                     json=body("ABANDON", stream=True)) as resp:
        async for line in resp.aiter_lines():
            if "content_block_delta" in line:
                break  # the sandbox hangs up mid-reply
    (rec,) = await proxied.records_once_stored()
    assert rec.outcome == "aborted" and rec.input_tokens == 100_000
    assert 1 <= rec.output_tokens < 50_000  # estimated from what was generated before the hang-up
    assert rec.cost_usd >= 0.1


async def test_a_call_abandoned_before_the_reply_started_is_still_billed(proxied: Harness,
                                                                          fake_model: FakeModel) -> None:
    fake_model.script("ABANDON-EARLY", [{"content": [{"type": "text", "text": "late"}], "usage": BIG, "wait": 0.5}])
    call = asyncio.ensure_future(proxied.post(body("ABANDON-EARLY", stream=True)))
    for _ in range(400):  # the API has the request and is slow to answer
        if fake_model.requests_containing("ABANDON-EARLY"):
            break
        await asyncio.sleep(0.01)
    call.cancel()  # the sandbox hangs up before the reply's headers
    with pytest.raises(asyncio.CancelledError):
        await call
    (rec,) = await proxied.records_once_stored()
    assert (rec.outcome, rec.reason, rec.input_tokens) == ("aborted", "client_gone", 100_000)
    assert rec.cost_usd >= 0.1


async def test_refusal_records_are_bounded(make: Any, fake_model: FakeModel) -> None:
    h = await make(ModelPolicy(prices=PRICES), turn=False)
    log = h.proxy._bound["sb1"].refusal_log
    rate, log.rate = log.rate, 1e-9  # no refill during the flood, however long a loaded host takes for it
    for _ in range(70):
        await h.post(body("POL-FLOOD"))
    records = await h.records()
    assert len(records) == 60
    assert h.proxy._bound["sb1"].suppressed == 10
    log.rate = rate
    log.at -= 1.0  # a second passes: the log has room for one more row
    await h.post(body("POL-FLOOD"))
    last = (await h.records())[-1]
    assert "more refusals not listed" in (last.detail or "")


# --- credentials, headers, metrics and the proxy's own failures (mutation run of _model_proxy.py) -------

async def test_no_credential_or_hop_header_of_the_sandbox_reaches_the_api(proxied: Harness,
                                                                           fake_model: FakeModel) -> None:
    sent = {"X-Api-Key": "sandbox-dummy", "Proxy-Authorization": "Basic bGVha2Vk", "Authorization": "Bearer leaked",
            "Connection": "keep-alive", "Keep-Alive": "timeout=5", "TE": "trailers", "Proxy-Connection": "keep-alive",
            "Accept-Encoding": "gzip, br", "Anthropic-Beta": "tools-2024", "Content-Type": "text/plain"}
    raw = json.dumps(body("HDR-1")).encode()
    resp = await proxied.client.post("http://model-proxy/v1/messages", content=raw, headers=sent)
    assert resp.status_code == 200, resp.text
    (seen,) = fake_model.requests_containing("HDR-1")
    lines = seen["header_list"]  # every header line, a repeated one too
    names = [name for name, _ in lines]
    assert [value for name, value in lines if name == "x-api-key"] == ["sk-bound"]
    assert "sandbox-dummy" not in json.dumps(lines) and "leaked" not in json.dumps(lines).lower()
    for name in ("proxy-authorization", "authorization", "connection", "keep-alive", "te", "proxy-connection"):
        assert name not in names, name
    assert [value for name, value in lines if name == "host"] == [fake_model.url.split("://")[1]]  # not "model-proxy"
    assert [value for name, value in lines if name == "accept-encoding"] == ["identity"]
    assert [value for name, value in lines if name == "content-type"] == ["application/json"]
    assert seen["headers"]["anthropic-beta"] == "tools-2024"  # the API's own headers pass


async def test_the_servers_key_serves_sessions_without_a_credential(fake_model: FakeModel) -> None:
    run = Path(tempfile.mkdtemp(prefix="ashd-mp-", dir="/tmp"))
    server_key = ["sk-server"]
    proxy = ModelProxy(fake_model.url + "/", default_key=lambda: server_key[0], policy=ModelPolicy(prices=PRICES))
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(run / "model.sock")))
    try:
        await proxy.start_for("sb1", run / "model.sock")
        await proxy.start_for("sb1", run / "other.sock")  # idempotent: still the first socket
        assert (run / "model.sock").stat().st_mode & 0o777 == 0o666  # the sandbox user connects to it
        assert not (run / "other.sock").exists()
        proxy.bind("sb1", ModelBinding("s1", "acme", "agent", SessionModels(MODEL)))  # no key of its own
        proxy.begin_turn("sb1", "q-1", None, None)
        assert (await client.post("http://model-proxy/v1/messages", json=body("KEY-SERVER"))).status_code == 200
        proxy.set_key_provider("sb1", lambda: "sk-override")
        assert (await client.post("http://model-proxy/v1/messages", json=body("KEY-SERVER"))).status_code == 200
        proxy.set_key_provider("sb1", None)  # back to the server's key
        assert (await client.post("http://model-proxy/v1/messages", json=body("KEY-SERVER"))).status_code == 200
        seen = fake_model.requests_containing("KEY-SERVER")
        assert [r["headers"]["x-api-key"] for r in seen] == ["sk-server", "sk-override", "sk-server"]
        assert all(r["path"] == "/v1/messages" for r in seen)
        server_key[0] = ""  # ANTHROPIC_API_KEY unset: a 401, nothing sent
        resp = await client.post("http://model-proxy/v1/messages", json=body("KEY-SERVER"))
        refusal(resp, 401, "authentication_error", "no_key")
        assert len(fake_model.requests_containing("KEY-SERVER")) == 3
    finally:
        await client.aclose()
        await proxy.close()
        shutil.rmtree(run, ignore_errors=True)


async def test_a_stale_socket_is_replaced_and_a_stopped_proxy_is_gone(make: Any, fake_model: FakeModel,
                                                                      tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    h = await make(ModelPolicy(prices=PRICES))
    assert signal.getsignal(signal.SIGTERM) == before  # the server's shutdown stays the server's
    assert (await h.post(body("STOP-1"))).status_code == 200
    await h.proxy.stop_for("sb1")  # stores the records of its calls without being asked
    assert [r.outcome for r in h.stored] == ["ok"]
    with pytest.raises(httpx2.TransportError):
        await h.post(body("STOP-1"))
    stale = tmp_path / "model.sock"
    stale.write_text("left by a killed server")
    await h.proxy.start_for("sb1", stale)
    h.proxy.bind("sb1", ModelBinding("s1", "acme", "agent", SessionModels(MODEL), key=lambda: "sk-bound"))
    h.proxy.begin_turn("sb1", "q-2", None, None)
    async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(stale))) as client:
        assert (await client.post("http://model-proxy/v1/messages", json=body("STOP-2"))).status_code == 200
    await h.proxy.stop_for("sb1")
    assert not stale.exists()
    await h.proxy.stop_for("sb1")  # twice: nothing left to stop
    await h.proxy.start_for("sb2", stale)
    await h.proxy.close()  # the server shuts down: every socket goes
    assert not stale.exists()


async def test_metrics_count_forwarded_calls_and_refusals(fake_model: FakeModel) -> None:
    metrics = Metrics()
    run = Path(tempfile.mkdtemp(prefix="ashd-mp-", dir="/tmp"))
    proxy = ModelProxy(fake_model.url, policy=ModelPolicy(prices=PRICES), metrics=metrics)
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(run / "model.sock")))
    fake_model.script("METRIC-1", [{"content": [{"type": "text", "text": "counted"}], "usage": BIG}])
    try:
        await proxy.start_for("sb1", run / "model.sock")
        assert (await client.post("http://model-proxy/v1/messages", json=body("METRIC-1"))).status_code == 403
        proxy.bind("sb1", ModelBinding("s1", "acme", "agent", SessionModels(MODEL), key=lambda: "sk-bound"))
        proxy.begin_turn("sb1", "q-1", None, None)
        assert (await client.post("http://model-proxy/v1/messages", json=body("METRIC-1"))).status_code == 200
        refused = await client.post("http://model-proxy/v1/messages", json=body("METRIC-1", model="claude-opus-4-1"))
        assert refused.status_code == 403
        text = metrics.render().decode()
        assert f'ash_model_requests_total{{model="{MODEL}",outcome="ok"}} 1.0' in text
        assert 'outcome="refused"' not in text  # refusals have their own series
        assert f'ash_model_tokens_total{{model="{MODEL}",type="input"}} 100000.0' in text
        assert f'ash_model_tokens_total{{model="{MODEL}",type="output"}} 50000.0' in text
        assert f'ash_model_cost_usd_total{{model="{MODEL}"}} 0.6' in text
        assert f'ash_model_request_duration_seconds_count{{model="{MODEL}"}} 1.0' in text
        assert 'ash_model_refusals_total{model="none",reason="no_session"} 1.0' in text  # no body read yet
        assert 'ash_model_refusals_total{model="claude-opus-4-1",reason="model"} 1.0' in text
    finally:
        await client.aclose()
        await proxy.close()
        shutil.rmtree(run, ignore_errors=True)


async def test_an_unreachable_api_is_a_recorded_502(fake_model: FakeModel) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics()
    async with bound_to(f"http://127.0.0.1:{port}", budget=1.0, metrics=metrics) as (proxy, client, stored):
        resp = await client.post("http://model-proxy/v1/messages", json=body("DOWN-1"))
        assert resp.status_code == 502
        assert resp.json()["error"]["type"] == "api_error"
        assert "could not reach the model API" in resp.json()["error"]["message"]
        await proxy.flush()
        (rec,) = stored
        assert (rec.status, rec.outcome, rec.reason, rec.cost_usd) == (502, "error", "upstream_unreachable", 0)
        assert rec.latency_ms >= 0 and rec.query_id == "q-1"
        text = metrics.render().decode()
        assert f'ash_model_requests_total{{model="{MODEL}",outcome="error"}} 1.0' in text
        (seconds,) = re.findall(rf'ash_model_request_duration_seconds_sum{{model="{MODEL}"}} (\S+)', text)
        assert float(seconds) == pytest.approx(rec.latency_ms / 1000, rel=1e-6)
        summary = proxy.end_turn("sb1", "q-1")
        assert (summary.calls, summary.cost_usd) == (1, 0)  # the reservation is given back


async def test_calls_go_through_the_operators_proxy_which_alone_resolves_the_api(fake_model: FakeModel) -> None:
    """HTTP_PROXY with credentials: every call goes through the proxy, authenticated to it, and the
    API's name is resolved there only (`model-api.test` resolves nowhere else); the API sees the
    session's key and none of the proxy's headers; the calls are metered as ever."""
    fake_port = fake_model.url.rsplit(":", 1)[1]
    api = f"http://model-api.test:{fake_port}"
    auth = "Basic b3BzOnMzY3JldA=="  # ops:s3cret
    async with forward_proxy({"model-api.test": "127.0.0.1"}, require=auth) as egress:
        route = upstream_route(api, {"HTTP_PROXY": f"http://ops:s3cret@127.0.0.1:{egress.port}",
                                     "NO_PROXY": "internal.corp"})
        async with bound_to(api, route=route) as (proxy, client, stored):
            streamed = await client.post("http://model-proxy/v1/messages", json=body("EGRESS-1", stream=True))
            plain = await client.post("http://model-proxy/v1/messages", json=body("EGRESS-1"))
            assert streamed.status_code == 200 and "event: message_stop" in streamed.text
            assert plain.json()["content"][0]["text"] == "echo: EGRESS-1 hi"
            await proxy.flush()
            assert [(r.outcome, r.status) for r in stored] == [("ok", 200), ("ok", 200)]
            assert all(r.input_tokens > 0 for r in stored)
    assert len(egress.seen) == 2 and all(s.proxy_authorization == auth for s in egress.seen)
    assert all(s.request_line == f"POST {api}/v1/messages HTTP/1.1" for s in egress.seen)
    sent = fake_model.requests_containing("EGRESS-1")
    assert len(sent) == 2
    assert all(r["headers"]["x-api-key"] == "sk-bound" for r in sent)
    assert not any(name.lower().startswith("proxy-") for r in sent for name in r["headers"])


async def test_an_https_api_is_reached_through_a_tunnel_that_carries_the_proxys_credentials(
        fake_model: FakeModel) -> None:
    """For an https API the proxy is asked for a CONNECT tunnel, with the credentials on the CONNECT
    (inside the tunnel the API would see them otherwise). The fake model speaks no TLS, so the
    handshake through the tunnel fails: a recorded 502."""
    authority = f"model-api.test:{fake_model.url.rsplit(':', 1)[1]}"
    async with forward_proxy({"model-api.test": "127.0.0.1"}) as egress:
        route = upstream_route(f"https://{authority}", {"HTTPS_PROXY": f"http://ops:s3cret@127.0.0.1:{egress.port}"})
        async with bound_to(f"https://{authority}", route=route) as (proxy, client, stored):
            resp = await client.post("http://model-proxy/v1/messages", json=body("TUNNEL-1"))
            assert resp.status_code == 502
            await proxy.flush()
            assert [(r.outcome, r.reason) for r in stored] == [("error", "upstream_unreachable")]
    assert [(s.request_line, s.proxy_authorization) for s in egress.seen] == [
        (f"CONNECT {authority} HTTP/1.1", "Basic b3BzOnMzY3JldA==")]


async def test_a_proxy_that_refuses_or_is_down_is_a_recorded_error(fake_model: FakeModel) -> None:
    api = f"http://model-api.test:{fake_model.url.rsplit(':', 1)[1]}"
    async with forward_proxy({"model-api.test": "127.0.0.1"}, require="Basic other") as egress:
        route = upstream_route(api, {"HTTP_PROXY": f"http://127.0.0.1:{egress.port}"})
        async with bound_to(api, route=route) as (proxy, client, stored):
            resp = await client.post("http://model-proxy/v1/messages", json=body("EGRESS-407"))
            assert resp.status_code == 407  # the proxy's answer, passed on and recorded
            await proxy.flush()
            assert [(r.outcome, r.status) for r in stored] == [("error", 407)]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    route = upstream_route(api, {"HTTP_PROXY": f"http://127.0.0.1:{closed}"})
    async with bound_to(api, route=route) as (proxy, client, stored):
        resp = await client.post("http://model-proxy/v1/messages", json=body("EGRESS-DOWN"))
        assert resp.status_code == 502
        assert "could not reach the model API" in resp.json()["error"]["message"]
        await proxy.flush()
        assert [(r.outcome, r.reason) for r in stored] == [("error", "upstream_unreachable")]
    assert fake_model.requests_containing("EGRESS-") == []


async def test_a_model_api_on_loopback_is_reached_directly_past_the_proxy(fake_model: FakeModel) -> None:
    async with forward_proxy() as egress:
        route = upstream_route(fake_model.url, {"HTTP_PROXY": f"http://127.0.0.1:{egress.port}"})
        async with bound_to(fake_model.url, route=route) as (_proxy, client, _stored):
            resp = await client.post("http://model-proxy/v1/messages", json=body("LOOPBACK-1"))
            assert resp.status_code == 200
    assert egress.seen == []


async def test_only_post_is_forwarded_and_other_paths_are_recorded(proxied: Harness, fake_model: FakeModel) -> None:
    for method in ("GET", "PUT"):
        resp = await proxied.client.request(method, "http://model-proxy/v1/messages", json=body("PATH-1"))
        refusal(resp, 405, "invalid_request_error", "not_forwarded")
    long_path = "/v1/" + "x" * 300
    message = refusal(await proxied.client.post(f"http://model-proxy{long_path}", json=body("PATH-1")), 404,
                      "not_found_error", "not_forwarded")
    assert message.endswith(f"are forwarded, not {long_path[:200]}")  # the path, cut short
    records = await proxied.records()
    assert [(r.endpoint, r.status, r.reason, r.query_id) for r in records] == [
        ("messages", 405, "not_forwarded", "q-1"), ("messages", 405, "not_forwarded", "q-1"),
        (long_path[:64], 404, "not_forwarded", "q-1")]
    assert fake_model.requests_containing("PATH-1") == []


async def test_a_config_change_moves_the_sessions_models(proxied: Harness) -> None:
    refusal(await proxied.post(body("CFG-1", model="claude-opus-4-1")), 403, "permission_error", "model")
    proxied.proxy.update_models("sb1", SessionModels(MODEL, ("claude-opus-*",)))
    proxied.proxy.update_models("sb-unknown", SessionModels(MODEL, ("claude-opus-*",)))  # no such sandbox: ignored
    assert (await proxied.post(body("CFG-1", model="claude-opus-4-1"))).status_code == 200
    proxied.proxy.end_turn("sb1", "q-1")
    proxied.proxy.begin_turn("sb1", "q-2", None, None)  # a turn naming no model runs the session's new default
    proxied.proxy.update_models("sb1", SessionModels("claude-haiku-4-5"))
    proxied.proxy.end_turn("sb1", "q-2")
    proxied.proxy.begin_turn("sb1", "q-3", None, None)
    assert (await proxied.post(body("CFG-1", model="claude-haiku-4-5"))).status_code == 200
    refusal(await proxied.post(body("CFG-1")), 403, "permission_error", "model")


async def test_only_the_running_turn_can_be_ended(proxied: Harness) -> None:
    assert (await proxied.post(body("TURN-1"))).status_code == 200
    for earlier in ("q-0", "q-old"):  # a late end of an earlier turn
        stale = proxied.proxy.end_turn("sb1", earlier)
        assert (stale.calls, stale.model_ms, stale.cost_usd) == (0, 0, 0)
    assert (await proxied.post(body("TURN-1"))).status_code == 200  # q-1 still runs
    summary = proxied.proxy.end_turn("sb1", "".join(["q-", "1"]))  # the id as parsed from a request: equal, not same
    assert summary.calls == 2 and summary.model_ms > 0
    assert proxied.proxy.end_turn("sb1", "q-1").calls == 0  # ended once
    refusal(await proxied.post(body("TURN-1")), 403, "permission_error", "no_turn")
    assert proxied.proxy.end_turn("sb-unknown", "q-1").calls == 0
    records = await proxied.records()
    assert [r.query_id for r in records] == ["q-1", "q-1", None]


async def test_suppressed_refusals_are_counted_in_the_next_row(make: Any) -> None:
    h = await make(ModelPolicy(prices=PRICES), turn=False)
    for _ in range(63):
        refusal(await h.post(body("FLOOD-2")), 403, "permission_error", "no_turn")  # all refused, 60 listed
    listed = await h.records()
    assert len(listed) == 60 and not any("more refusals" in (r.detail or "") for r in listed)
    h.proxy._bound["sb1"].refusal_log.at -= 1.0  # a second passes: room for one more row
    await h.post(body("FLOOD-2"))
    h.proxy._bound["sb1"].refusal_log.at -= 1.0
    await h.post(body("FLOOD-2"))
    records = await h.records()
    assert len(records) == 62
    assert (records[-2].detail or "").endswith(" (3 more refusals not listed)")
    assert "more refusals" not in (records[-1].detail or "")  # the count starts again


async def test_token_counting_does_not_free_a_budget_held_by_a_call_in_flight(make: Any,
                                                                              fake_model: FakeModel) -> None:
    fake_model.script("HELD-1", [{"content": [{"type": "text", "text": "slow " * 20}],
                                 "usage": {"input_tokens": 10, "output_tokens": 10}, "delay": 0.1}])
    h = await make(ModelPolicy(prices=PRICES), budget=0.1)
    slow = asyncio.ensure_future(h.post(body("HELD-1", max_tokens=10_000, stream=True)))  # holds the $0.10
    for _ in range(400):
        if fake_model.requests_containing("HELD-1") or slow.done():
            break
        await asyncio.sleep(0.01)
    assert (await h.post(body("HELD-2"), path="/v1/messages/count_tokens")).status_code == 200
    refusal(await h.post(body("HELD-3", max_tokens=10_000)), 402, "billing_error", "turn_budget")
    assert (await slow).status_code == 200
    assert fake_model.requests_containing("HELD-3") == []
    # Settled: the slow call cost little, the counting nothing; the rest of the budget is there again.
    assert (await h.post(body("HELD-4", max_tokens=1000))).status_code == 200


async def test_each_call_is_billed_at_its_models_price(make: Any, fake_model: FakeModel) -> None:
    fake_model.script("PRICE-1", [{"content": [{"type": "text", "text": "priced"}], "usage": BIG}])
    prices = PriceTable((("claude-haiku-*", Price(2.0, 20.0, 2.0, 0.2)), ("*", Price(1.0, 10.0, 1.0, 0.1))))
    h = await make(ModelPolicy(prices=prices))
    assert (await h.post(body("PRICE-1", model="claude-haiku-4-5"))).status_code == 200
    assert (await h.post(body("PRICE-1"))).status_code == 200
    assert [(r.model, r.cost_usd) for r in await h.records()] == [("claude-haiku-4-5", pytest.approx(1.2)),
                                                                  (MODEL, pytest.approx(0.6))]


async def test_a_reply_that_stops_coming_is_recorded_as_broken(fake_model: FakeModel) -> None:
    fake_model.script("BROKE-1", [{"content": [{"type": "text", "text": "never"}], "usage": BIG, "delay": 1.0}])
    async with bound_to(fake_model.url, timeout_s=0.2) as (proxy, client, stored):
        resp = await client.post("http://model-proxy/v1/messages", json=body("BROKE-1", stream=True))
        assert resp.status_code == 200 and "message_stop" not in resp.text  # the reply ends where the API stopped
        await proxy.flush()
        (rec,) = stored
        assert (rec.status, rec.outcome, rec.reason) == (200, "error", "upstream_broke")
        assert "broke off" in (rec.detail or "")


async def test_an_api_that_accepts_no_connection_is_a_502_after_the_connect_timeout(
        fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model API whose host takes no connection (SYNs dropped: here a listener whose accept queue
    is full) is answered, not waited for until the sandbox's own client gives up."""
    monkeypatch.setattr(_model_proxy, "UPSTREAM_CONNECT_TIMEOUT_S", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # never accepts: one connection fills its queue, later SYNs are dropped
    filler = socket.create_connection(listener.getsockname())
    # The client waits 20 s: far above the 0.3 s asked, far below the 30 s default the proxy would otherwise wait.
    try:
        async with bound_to(f"http://127.0.0.1:{listener.getsockname()[1]}", budget=1.0,
                            client_timeout=20) as (proxy, client, stored):
            resp = await client.post("http://model-proxy/v1/messages", json=body("SILENT-1"))
            assert resp.status_code == 502
            assert resp.json()["error"]["message"] == ("model proxy could not reach the model API: "
                                                       "ConnectionTimeoutError")
            await proxy.flush()
            (rec,) = stored
            assert (rec.status, rec.outcome, rec.reason) == (502, "error", "upstream_unreachable")
    finally:
        filler.close()
        listener.close()


def test_the_timeouts_towards_the_model_api_are_the_documented_ones() -> None:
    # docs/operations.md: 30 s to connect, 600 s without a byte of the reply (the Anthropic SDK's
    # default). Both are shortened in the tests above, which show what each one does; seeing the
    # real values would take minutes.
    assert (_model_proxy.UPSTREAM_CONNECT_TIMEOUT_S, _model_proxy.UPSTREAM_READ_TIMEOUT_S) == (30.0, 600.0)


async def test_a_held_turns_calls_wait_for_its_prompt_and_go_on_once_it_is_stored(
        proxied: Harness, fake_model: FakeModel) -> None:
    """`begin_turn(held=True)`: the query went to the bridge while its prompt is being stored; the
    turn's calls are checked as they come and forwarded only once `admit_turn` says it is stored."""
    proxied.proxy.end_turn("sb1", "q-1")
    proxied.proxy.begin_turn("sb1", "q-2", None, None, held=True)
    waiting = asyncio.ensure_future(proxied.post(body("HELD-ADMITTED")))
    refused = await proxied.post(body("HELD-ADMITTED", model="claude-opus-4"))  # checks before the hold
    refusal(refused, 403, "permission_error", "model")
    await asyncio.sleep(0.3)
    assert not waiting.done() and not fake_model.requests_containing("HELD-ADMITTED")
    proxied.proxy.admit_turn("sb1", "q-1")  # another turn's word changes nothing
    await asyncio.sleep(0.1)
    assert not waiting.done()
    proxied.proxy.admit_turn("sb1", "q-2")
    assert (await waiting).status_code == 200
    assert len(fake_model.requests_containing("HELD-ADMITTED")) == 1
    assert (await proxied.post(body("HELD-ADMITTED"))).status_code == 200  # admitted from now on


@pytest.mark.parametrize("how", ["withdrawn", "sandbox let go"])
async def test_a_held_turns_calls_are_refused_when_its_prompt_is_not_stored(
        proxied: Harness, fake_model: FakeModel, how: str) -> None:
    proxied.proxy.end_turn("sb1", "q-1")
    proxied.proxy.begin_turn("sb1", "q-2", None, None, held=True)
    waiting = asyncio.ensure_future(proxied.post(body("HELD-REFUSED")))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    if how == "withdrawn":  # the prompt's write failed: the turn ends before it was admitted
        assert proxied.proxy.end_turn("sb1", "q-2").calls == 0
    else:
        await asyncio.wait_for(proxied.proxy.stop_for("sb1"), 5)  # not held until the site's timeout
    message = refusal(await asyncio.wait_for(waiting, 5), 403, "permission_error", "no_turn")
    assert "could not be stored" in message
    assert not fake_model.requests_containing("HELD-REFUSED")
