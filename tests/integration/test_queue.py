"""The queue through real HTTP on a real server (sandboxes, bridge, fake model): priority order,
cancel, retries against a model that fails, tenant rules, and the turn stored like any other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import deploy

pytestmark = pytest.mark.sandbox


@pytest.fixture
async def qapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    """One item at a time, fast retries."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        queue_concurrency=1, queue_concurrency_per_tenant=1, queue_retry_seconds=0.2, queue_lease_seconds=3.0))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def enqueue(api: Api, prompt: str, key: str | None = None, **extra: Any) -> dict[str, Any]:
    status, body = await api.call("POST", "/api/queue", key=key, json={"agentName": "helper", "prompt": prompt,
                                                                       **extra})
    assert status == 201, body
    item: dict[str, Any] = body["item"]
    assert item["status"] == "pending" and item["prompt"] == prompt
    return item


async def settled(api: Api, item_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The item once it is completed, failed or cancelled."""
    async with asyncio.timeout(timeout):
        while True:
            status, body = await api.call("GET", f"/api/queue/{item_id}")
            assert status == 200, body
            if body["item"]["status"] in ("completed", "failed", "cancelled"):
                return dict(body["item"])
            await asyncio.sleep(0.1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


async def test_priority_order_and_cancel(qapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(qapi)
    # The first item holds the only slot while the others queue up behind it.
    fake_model.script("BLOCKER", [{"content": [text("slow " * 40)], "delay": 0.05, "chunk": 2}])
    blocker = await enqueue(qapi, "BLOCKER")
    async with asyncio.timeout(30):
        while (await qapi.call("GET", f"/api/queue/{blocker['id']}"))[1]["item"]["status"] != "processing":
            await asyncio.sleep(0.05)
    low = await enqueue(qapi, "LOW-P", priority=-5)
    mid_old = await enqueue(qapi, "MID-OLD", priority=1)
    doomed = await enqueue(qapi, "DOOMED", priority=100)
    mid_new = await enqueue(qapi, "MID-NEW", priority=1)
    high = await enqueue(qapi, "HIGH-P", priority=10)

    status, body = await qapi.call("DELETE", f"/api/queue/{doomed['id']}")
    assert status == 200 and body["item"]["status"] == "cancelled" and body["item"]["completedAt"]
    status, body = await qapi.call("DELETE", f"/api/queue/{doomed['id']}")
    assert status == 400 and "cancelled" in body["error"] and body["statusCode"] == 400
    status, body = await qapi.call("DELETE", f"/api/queue/{blocker['id']}")
    assert status == 400 and "processing" in body["error"]

    done = [await settled(qapi, item["id"]) for item in (blocker, low, mid_old, mid_new, high)]
    assert all(item["status"] == "completed" for item in done), done
    order = [item["prompt"] for item in sorted(done, key=lambda i: i["startedAt"])]
    assert order == ["BLOCKER", "HIGH-P", "MID-OLD", "MID-NEW", "LOW-P"]
    assert not fake_model.requests_containing("DOOMED")
    assert (await qapi.call("GET", f"/api/queue/{doomed['id']}"))[1]["item"]["status"] == "cancelled"

    status, body = await qapi.call("GET", "/api/queue/stats")
    assert status == 200 and body == {"stats": {"pending": 0, "processing": 0, "completed": 5, "failed": 0,
                                                "cancelled": 1}}
    status, body = await qapi.call("GET", "/api/queue?status=completed&limit=2")
    assert status == 200 and [i["prompt"] for i in body["items"]] == ["HIGH-P", "MID-NEW"]  # newest first
    status, body = await qapi.call("GET", "/api/queue?status=sleeping")
    assert status == 400 and "status" in body["error"]


async def test_the_turn_is_a_normal_turn(qapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(qapi)
    fake_model.script("NORMAL-1", [{"content": [text("the answer is 42")]}])
    item = await settled(qapi, (await enqueue(qapi, "NORMAL-1"))["id"])
    assert item["status"] == "completed" and item["result"] == "the answer is 42", item
    assert item["retryCount"] == 0 and item["error"] is None and item["startedAt"] and item["completedAt"]
    sid = item["sessionId"]

    # Stored, replayable, metered; the session the queue made is paused, ready to resume.
    status, body = await qapi.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "paused" and body["session"]["agentName"] == "helper"
    status, body = await qapi.call("GET", f"/api/sessions/{sid}/messages")
    assert json.loads(body["messages"][0]["content"]) == {"type": "user", "content": "NORMAL-1"}
    resp = await qapi.client.get(f"/api/sessions/{sid}/stream?after=0", headers=qapi.headers())
    replay = await resp.text()
    assert resp.status == 200 and "the answer is 42" in replay and "event: done" in replay
    status, body = await qapi.call("GET", f"/api/usage?sessionId={sid}")
    kinds = {e["eventType"] for e in body["events"]}
    assert {"input_tokens", "output_tokens", "message"} <= kinds, kinds

    # A second item on that session resumes it and goes on with the conversation.
    fake_model.script("NORMAL-2", [{"content": [text("second")]}])
    again = await settled(qapi, (await enqueue(qapi, "NORMAL-2", sessionId=sid))["id"])
    assert again["status"] == "completed" and again["sessionId"] == sid and again["result"] == "second"
    history = fake_model.requests_containing("NORMAL-2")[-1]["body"]["messages"]
    assert "NORMAL-1" in json.dumps(history)
    status, body = await qapi.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "active"  # the client's own session stays as the queue left it


async def test_retries_then_completed_or_failed(qapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(qapi)
    refused = {"status": 401, "message": "invalid x-api-key"}
    fake_model.script("FLAKY", [{"errors": [refused, refused], "content": [text("third time lucky")]}])
    fake_model.script("BROKEN", [{"error": refused}])
    flaky = await enqueue(qapi, "FLAKY", maxRetries=3)
    broken = await enqueue(qapi, "BROKEN", maxRetries=1)

    flaky = await settled(qapi, flaky["id"])
    assert flaky["status"] == "completed" and flaky["retryCount"] == 2 and flaky["result"] == "third time lucky"
    assert flaky["error"] is None
    assert len(fake_model.requests_containing("FLAKY")) == 3
    broken = await settled(qapi, broken["id"])
    assert broken["status"] == "failed" and broken["retryCount"] == 1, broken
    assert "401" in broken["error"]
    assert len(fake_model.requests_containing("BROKEN")) == 2  # the first try and one retry
    # Every attempt ran in the same session: one conversation with both prompts.
    status, body = await qapi.call("GET", f"/api/sessions/{broken['sessionId']}/messages")
    prompts = [m for m in body["messages"] if json.loads(m["content"]).get("content") == "BROKEN"]
    assert len(prompts) == 2


async def test_input_and_tenant_rules(qapi: Api) -> None:
    await deploy(qapi)
    other = await qapi.new_tenant_key("tenant-b")
    item = await enqueue(qapi, "never runs", priority=-1000)
    for path in (f"/api/queue/{item['id']}",):
        assert (await qapi.call("GET", path, key=other))[0] == 404
        assert (await qapi.call("DELETE", path, key=other))[0] == 404
    status, body = await qapi.call("GET", "/api/queue", key=other)
    assert status == 200 and body == {"items": []}
    status, body = await qapi.call("GET", "/api/queue/stats", key=other)
    assert body["stats"] == {"pending": 0, "processing": 0, "completed": 0, "failed": 0, "cancelled": 0}
    # Another tenant's agent is not found either (a 400: a field of the body is wrong, as ash-ai-sdk expects).
    status, body = await qapi.call("POST", "/api/queue", key=other, json={"agentName": "helper", "prompt": "x"})
    assert status == 400 and "Agent helper not found" in body["error"]

    bad = [({"prompt": "x"}, "agentName"), ({"agentName": "helper"}, "prompt"),
           ({"agentName": "helper", "prompt": "x", "priority": "high"}, "priority"),
           ({"agentName": "helper", "prompt": "x", "maxRetries": -1}, "maxRetries"),
           ({"agentName": "helper", "prompt": "x", "retries": 2}, "retries")]
    for payload, named in bad:
        status, body = await qapi.call("POST", "/api/queue", json=payload)
        assert status == 400 and named in body["error"], (payload, body)
    status, body = await qapi.call("POST", "/api/queue", json={"agentName": "helper", "prompt": "x",
                                                                "sessionId": "0f0e0d0c-0000-4000-8000-000000000000"})
    assert status == 400 and "Session" in body["error"] and "sessionId" in body["error"]
    assert (await qapi.call("GET", "/api/queue/0f0e0d0c-0000-4000-8000-000000000000"))[0] == 404


@pytest.fixture
async def tenant_bound_api(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    """Room for three items at once, one per tenant."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        queue_concurrency=3, queue_concurrency_per_tenant=1))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def test_concurrency_is_bounded_per_tenant(tenant_bound_api: Api, fake_model: FakeModel) -> None:  # noqa: F811
    api = tenant_bound_api
    other = await api.new_tenant_key("tenant-b")
    for key in (None, other):
        status, body = await api.call("POST", "/api/agents", key=key, json={"name": "helper", "systemPrompt": "Hi."})
        assert status == 201, body
    fake_model.script("BOUNDED", [{"content": [text("busy " * 20)], "delay": 0.03, "chunk": 2}])
    mine = [await enqueue(api, f"BOUNDED-A{i}") for i in range(3)]
    theirs = [await enqueue(api, f"BOUNDED-B{i}", key=other) for i in range(2)]
    most = {"default": 0, "tenant-b": 0}
    both_at_once = False
    async with asyncio.timeout(120):
        while True:
            counts = {}
            for tenant, key in (("default", None), ("tenant-b", other)):
                counts[tenant] = (await api.call("GET", "/api/queue/stats", key=key))[1]["stats"]
                most[tenant] = max(most[tenant], counts[tenant]["processing"])
            both_at_once |= all(c["processing"] == 1 for c in counts.values())
            if counts["default"]["completed"] == 3 and counts["tenant-b"]["completed"] == 2:
                break
            await asyncio.sleep(0.02)
    assert most == {"default": 1, "tenant-b": 1}  # never two of one tenant, though there was room
    assert both_at_once  # the bound is per tenant: the other tenant's item ran alongside
    assert [(await settled(api, item["id"]))["result"] for item in mine] == ["busy " * 20] * 3
    status, body = await api.call("GET", "/api/queue?status=completed", key=other)
    assert sorted(i["id"] for i in body["items"]) == sorted(i["id"] for i in theirs)


async def test_a_stopping_server_hands_its_running_items_back(aiohttp_client: Any, settings: Settings,
                                                              fake_model: FakeModel) -> None:  # noqa: F811
    # A long lease: the item must come back because the server gave it back, not because a lease ran out.
    config = settings.with_(zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test",
                            queue_lease_seconds=600.0, shutdown_grace_seconds=1.0)
    server, api = await start_api(aiohttp_client, config)
    try:
        await deploy(api)
        fake_model.script("HANDED-BACK", [{"content": [text("never finished " * 50)], "delay": 0.2, "chunk": 1}])
        item = await enqueue(api, "HANDED-BACK")
        async with asyncio.timeout(30):
            while not fake_model.requests_containing("HANDED-BACK"):
                await asyncio.sleep(0.05)
    finally:
        await api.client.close()
        await server.stop()

    fake_model.script("HANDED-BACK", [{"content": [text("finished by the next start")]}])
    server, api = await start_api(aiohttp_client, config)
    try:
        status, body = await api.call("GET", f"/api/queue/{item['id']}")
        assert body["item"]["status"] in ("pending", "processing", "completed"), body
        done = await settled(api, item["id"], timeout=60)
        assert done["status"] == "completed" and done["result"] == "finished by the next start", done
        # Handed back before the stopping sandbox cut the turn short: the stop is not a failed attempt.
        assert done["retryCount"] == 0
    finally:
        await api.client.close()
        await server.stop()
