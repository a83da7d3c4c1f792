"""Usage events and stats through real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from ashd.components import Components
from ashd.storage._usage import record_usage
from tests.conftest import Api

ZERO_STATS = {
    "totalInputTokens": 0, "totalOutputTokens": 0, "totalCacheCreationTokens": 0, "totalCacheReadTokens": 0,
    "totalToolCalls": 0, "totalMessages": 0, "totalComputeSeconds": 0,
}


def services_of(api: Api) -> Components:
    assert api.server.components is not None
    return api.server.components


async def record_turns(api: Api) -> None:
    db = services_of(api).db
    turn = {"input_tokens": 100, "output_tokens": 40, "cache_creation_tokens": 5, "cache_read_tokens": 0,
            "tool_calls": 2, "message": 1, "compute_seconds": 1.5}
    assert await record_usage(db, "default", "s1", "alpha", turn) == 6  # zero value not stored
    await record_usage(db, "default", "s1", "alpha", {**turn, "input_tokens": 50})
    await record_usage(db, "default", "s2", "beta", {"input_tokens": 7, "message": 1})
    await record_usage(db, "acme", "s9", "alpha", {"input_tokens": 1000, "message": 1})


async def test_stats_add_up_and_filter(api: Api) -> None:
    await record_turns(api)
    status, body = await api.call("GET", "/api/usage/stats")
    assert status == 200
    assert body["stats"] == {
        "totalInputTokens": 157, "totalOutputTokens": 80, "totalCacheCreationTokens": 10,
        "totalCacheReadTokens": 0, "totalToolCalls": 4, "totalMessages": 3, "totalComputeSeconds": 3.0,
    }
    _, body = await api.call("GET", "/api/usage/stats", params={"sessionId": "s2"})
    assert body["stats"] == {**ZERO_STATS, "totalInputTokens": 7, "totalMessages": 1}
    _, body = await api.call("GET", "/api/usage/stats", params={"agentName": "alpha"})
    assert body["stats"]["totalInputTokens"] == 150
    assert body["stats"]["totalMessages"] == 2
    _, body = await api.call("GET", "/api/usage/stats", params={"sessionId": "unknown"})
    assert body["stats"] == ZERO_STATS


async def test_events_list_scoped_ordered_and_limited(api: Api) -> None:
    await record_turns(api)
    status, body = await api.call("GET", "/api/usage")
    assert status == 200
    events = body["events"]
    assert len(events) == 14
    assert all(e["tenantId"] == "default" for e in events)
    assert [e["createdAt"] for e in events] == sorted(e["createdAt"] for e in events)
    first = events[0]
    assert set(first) == {"id", "tenantId", "sessionId", "agentName", "eventType", "value", "createdAt"}
    _, body = await api.call("GET", "/api/usage", params={"sessionId": "s2"})
    assert {(e["eventType"], e["value"]) for e in body["events"]} == {("input_tokens", 7), ("message", 1)}
    _, body = await api.call("GET", "/api/usage", params={"limit": "3"})
    assert len(body["events"]) == 3

    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    _, body = await api.call("GET", "/api/usage", params={"after": future})
    assert body["events"] == []
    _, body = await api.call("GET", "/api/usage", params={"after": past, "before": future})
    assert len(body["events"]) == 14
    _, body = await api.call("GET", "/api/usage", params={"before": "2000-01-01T00:00:00Z"})
    assert body["events"] == []


async def test_tenant_scoping(api: Api) -> None:
    await record_turns(api)
    other = await api.new_tenant_key("acme")
    _, body = await api.call("GET", "/api/usage/stats", key=other)
    assert body["stats"] == {**ZERO_STATS, "totalInputTokens": 1000, "totalMessages": 1}
    _, body = await api.call("GET", "/api/usage", key=other)
    assert [e["sessionId"] for e in body["events"]] == ["s9", "s9"]
    fresh = await api.new_tenant_key("nobody")
    _, body = await api.call("GET", "/api/usage/stats", key=fresh)
    assert body["stats"] == ZERO_STATS


async def test_bad_queries_are_400(api: Api) -> None:
    for params in ({"limit": "0"}, {"limit": "abc"}, {"limit": "1001"}, {"after": "yesterday"},
                   {"before": "2025-13-01"}):
        status, body = await api.call("GET", "/api/usage", params=params)
        assert (status, body["statusCode"]) == (400, 400), params
    status, body = await api.call("GET", "/api/usage/stats", params={"after": "nope"})
    assert status == 400
    assert "ISO 8601" in body["error"]


async def test_record_usage_refuses_nonsense(api: Api) -> None:
    with pytest.raises(ValueError, match="finite"):
        await record_usage(services_of(api).db, "default", "s", "a", {"input_tokens": float("nan")})
    assert await record_usage(services_of(api).db, "default", "s", "a", {"input_tokens": 0}) == 0
