"""The pieces of the model proxy that need no socket: the usage meter, the price table, the model
precedence of a session, the budgets' arithmetic and the record writer."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ashd.devtools._fake_stream import full_message, sse_events
from ashd.pricing import DEFAULT_TABLE, Price, PriceTable, parse_prices
from ashd.sandboxing._model_budget import month_start, next_month
from ashd.sandboxing._model_meter import UsageMeter
from ashd.sandboxing._model_policy import ModelPolicy, SessionModels, parse_tenant_budgets, session_models
from ashd.sandboxing._model_records import RecordWriter
from ashd.storage import ModelCallRecord

USAGE = {"input_tokens": 1234, "output_tokens": 567, "cache_creation_input_tokens": 89, "cache_read_input_tokens": 10}


def sse_bytes(turn: dict[str, Any], crlf: bool = False) -> bytes:
    text = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in sse_events(turn, "m", 1234))
    return (text.replace("\n", "\r\n") if crlf else text).encode()


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
@pytest.mark.parametrize("crlf", [False, True])
def test_stream_usage_whatever_the_chunking(size: int, crlf: bool) -> None:
    raw = sse_bytes({"content": [{"type": "text", "text": "hello " * 50}], "usage": USAGE}, crlf)
    meter = UsageMeter(streaming=True)
    for i in range(0, len(raw), size):
        meter.feed(raw[i:i + size])
    meter.finish()
    assert meter.usage == USAGE
    assert meter.started and meter.finished and meter.model == "m" and meter.error_type is None


def test_message_delta_totals_win_and_multiline_data() -> None:
    start = {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 5, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 40, "input_tokens": 7, "cache_read_input_tokens": None}}
    text = json.dumps(delta, indent=1)  # data split over several `data:` lines
    raw = f"event: message_start\ndata: {json.dumps(start)}\n\nevent: message_delta\n" + \
        "".join(f"data: {line}\n" for line in text.splitlines()) + "\n"
    meter = UsageMeter(streaming=True)
    meter.feed(raw.encode())
    meter.finish()
    assert meter.usage["input_tokens"] == 7 and meter.usage["output_tokens"] == 40


def test_stream_error_event_and_nonsense_values() -> None:
    raw = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":-3,'
           b'"output_tokens":"9"}}}\n\nevent: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
           b'"message":"busy"}}\n\n')
    meter = UsageMeter(streaming=True)
    meter.feed(raw)
    meter.finish()
    assert meter.usage["input_tokens"] == 0 and meter.usage["output_tokens"] == 0
    assert (meter.error_type, meter.error_message) == ("overloaded_error", "busy")


def test_json_bodies() -> None:
    meter = UsageMeter(streaming=False)
    raw = json.dumps(full_message({"content": [{"type": "text", "text": "x"}], "usage": USAGE}, "m", 1)).encode()
    for i in range(0, len(raw), 10):
        meter.feed(raw[i:i + 10])
    meter.finish()
    assert meter.usage == USAGE and meter.finished
    error = UsageMeter(streaming=False)
    error.feed(b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}')
    error.finish()
    assert error.error_type == "rate_limit_error" and error.usage["input_tokens"] == 0


def test_abandoned_stream_output_estimate() -> None:
    turn = {"content": [{"type": "text", "text": "z" * 3000}], "usage": USAGE, "chunk": 30}
    raw = sse_bytes(turn)
    cut = raw.index(b"content_block_stop")
    meter = UsageMeter(streaming=True)
    meter.feed(raw[:cut])
    assert meter.started and not meter.finished
    # 3000 characters at 3 a token, counted from the bytes of the delta lines: never fewer
    assert 1000 <= meter.estimated_output() <= 2000


def test_prices_overrides_globs_and_the_fallback(tmp_path: Path) -> None:
    assert DEFAULT_TABLE.cost("claude-sonnet-4-5", {"input_tokens": 1_000_000, "output_tokens": 1_000_000}) == 18.0
    assert DEFAULT_TABLE.cost("claude-opus-4-5-20251101", {"cache_creation_input_tokens": 1_000_000}) == 6.25
    assert DEFAULT_TABLE.price("some-new-model") == DEFAULT_TABLE.price("claude-opus-4-1")  # never cheaper
    table = PriceTable(parse_prices('{"claude-*-lab": {"input": 2, "output": 4, "cacheRead": 0}}'))
    assert table.price("claude-x-lab") == Price(2.0, 4.0, 2.5, 0.0)
    assert table.price("claude-sonnet-4-5").input == 3.0
    path = tmp_path / "prices.json"
    path.write_text('{"sonnet": {"input": 1, "output": 1}}')
    assert PriceTable(parse_prices(str(path))).price("claude-sonnet-4-5").output == 1.0
    assert table.worst_case("claude-x-lab", 1000, 2000) == pytest.approx((1000 * 2.5 + 2000 * 4) / 1e6)
    for bad in ('{"m": {"input": -1, "output": 1}}', '{"m": {"input": 1}}', "[]", "{}", str(tmp_path / "none")):
        with pytest.raises(ValueError):
            parse_prices(bad)


def test_tenant_budget_settings() -> None:
    assert parse_tenant_budgets("acme=10, beta=2.5,") == {"acme": 10.0, "beta": 2.5}
    for bad in ("acme", "acme=0", "=3", "acme=x", "acme=inf"):
        with pytest.raises(ValueError):
            parse_tenant_budgets(bad)
    policy = ModelPolicy(tenant_budget_usd=1.0, tenant_budgets={"acme": 10.0})
    assert policy.tenant_budget("acme") == 10.0 and policy.tenant_budget("other") == 1.0


def test_session_models_follow_the_precedence(tmp_path: Path) -> None:
    (tmp_path / ".agent").mkdir()
    (tmp_path / ".agent" / "settings.json").write_text(json.dumps(
        {"model": "m-settings", "allowedModels": ["claude-haiku-*", 5]}))
    subagents = {"a": {"model": "opus"}, "b": {"model": "inherit"}, "c": {}}
    models = session_models(None, None, str(tmp_path), {"subagents": subagents})
    assert models == SessionModels("m-settings", ("claude-opus-4-5", "claude-haiku-*"))
    assert session_models(None, "m-agent", str(tmp_path), {}).default == "m-agent"
    assert session_models("m-session", "m-agent", str(tmp_path), {}).default == "m-session"
    assert session_models(None, None, str(tmp_path / "gone"), {}).default == "claude-sonnet-4-5"
    policy = ModelPolicy(allow=("claude-3-*",))
    assert models.permits("m-message", "m-message", policy)
    assert models.permits("claude-haiku-4-5", "m-settings", policy)
    assert models.permits("claude-3-opus", "m-settings", policy)
    assert not models.permits("claude-opus-4-1", "m-settings", policy)


def test_calendar_months() -> None:
    start = month_start(dt.datetime(2025, 12, 31, 23, 59, tzinfo=dt.UTC))
    assert start == dt.datetime(2025, 12, 1, tzinfo=dt.UTC)
    assert next_month(start) == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def record(i: int, query_id: str | None = None) -> ModelCallRecord:
    return ModelCallRecord(str(i), "s", "t", "a", "sb", query_id, "messages", "m", False, 10, 200, "ok", None, None,
                           1, 1, 0, 0, 0.1, 1.0, None, dt.datetime.now(dt.UTC), "test")


async def test_record_writer_keeps_what_it_could_not_store(caplog: pytest.LogCaptureFixture) -> None:
    stored: list[ModelCallRecord] = []
    failing = asyncio.Event()
    failing.set()

    async def store(batch: Sequence[ModelCallRecord]) -> None:
        if failing.is_set():
            raise OSError("database down")
        stored.extend(batch)

    writer = RecordWriter(store)
    writer.add(record(1))
    writer.add(record(2))
    with pytest.raises(OSError):
        await writer.flush()
    assert writer.pending == 2 and stored == []
    failing.clear()
    await writer.flush()
    assert [r.id for r in stored] == ["1", "2"] and writer.pending == 0
    failing.set()
    writer.add(record(3))
    await writer.close()  # storage still down at shutdown: the record goes to the error log
    spilled = [r for r in caplog.records if r.getMessage() == "model call record not stored"]
    assert len(spilled) == 1 and json.loads(spilled[0].record)["id"] == "3"  # type: ignore[attr-defined]


async def test_a_turn_takes_its_records_out_of_the_writer() -> None:
    """`take` gives one turn's queued records and leaves the rest; it waits for a batch being stored
    (which may hold some of them); records given back are stored like any other."""
    stored: list[str] = []
    storing, release = asyncio.Event(), asyncio.Event()

    async def store(batch: Sequence[ModelCallRecord]) -> None:
        storing.set()
        await release.wait()
        stored.extend(r.id for r in batch)

    release.set()
    writer = RecordWriter(store)
    writer.add(record(2, "q1"))
    writer.add(record(3, "q2"))
    writer.add(record(4))  # a call outside any turn
    assert [r.id for r in await writer.take("q1")] == ["2"]
    assert writer.pending == 2  # q2's and the one outside a turn stay for the writer
    writer.put_back([record(2, "q1")])  # its turn could not store it
    await writer.flush()
    assert sorted(stored) == ["2", "3", "4"] and writer.pending == 0
    # A batch being stored holds a turn's record: `take` waits for it and does not give it twice.
    release.clear()
    storing.clear()
    writer.add(record(5, "q5"))
    flushing = asyncio.create_task(writer.flush())
    await storing.wait()
    taking = asyncio.create_task(writer.take("q5"))
    await asyncio.sleep(0.01)
    assert not taking.done()
    release.set()
    await flushing
    assert await taking == [] and stored.count("5") == 1
    assert await RecordWriter(None).take("q1") == []


def test_model_settings_are_validated_at_start() -> None:
    from ashd.config import load_settings
    from ashd.errors import ConfigError

    settings = load_settings({"SERVICE_MODEL_ALLOW": "claude-opus-*, claude-3-*", "SERVICE_MODEL_MAX_TOKENS": "64000",
                              "SERVICE_MODEL_TENANT_BUDGETS": "acme=5", "SERVICE_MODEL_SESSION_BUDGET_USD": "2.5",
                              "SERVICE_MODEL_PRICES": '{"lab": {"input": 1, "output": 2}}'})
    policy = ModelPolicy.from_settings(settings)
    assert policy.allow == ("claude-opus-*", "claude-3-*") and policy.max_tokens == 64000
    assert policy.session_budget_usd == 2.5 and policy.tenant_budget("acme") == 5.0
    assert policy.tenant_budget("other") is None and policy.prices.price("lab-1").output == 2.0
    for name, value in (("SERVICE_MODEL_PRICES", '{"lab": 3}'), ("SERVICE_MODEL_TENANT_BUDGETS", "acme"),
                        ("SERVICE_MODEL_SESSION_BUDGET_USD", "0"), ("SERVICE_MODEL_MAX_TOKENS", "0")):
        with pytest.raises(ConfigError, match=name):
            load_settings({name: value})
