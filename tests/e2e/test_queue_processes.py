"""The queue across real `python -m ashd serve` processes: a server killed (SIGKILL) in the middle of
an item, then started again, runs the item again and it completes once; two servers on one
PostgreSQL database run every one of many items exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.fixtures.databases import fresh_postgres
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_session_restart import Proc, _call, http, proc  # noqa: F401

pytestmark = pytest.mark.sandbox
FAST_QUEUE = {"SERVICE_QUEUE_LEASE_SECONDS": "2", "SERVICE_QUEUE_RETRY_SECONDS": "0.2"}


async def _item(http: aiohttp.ClientSession, p: Proc, key: str, item_id: str) -> dict[str, Any]:  # noqa: F811
    status, body = await _call(http, p, key, "GET", f"/api/queue/{item_id}")
    assert status == 200, body
    return dict(body["item"])


async def _settled(http: aiohttp.ClientSession, p: Proc, key: str, item_id: str,  # noqa: F811
                   timeout: float = 90) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while (item := await _item(http, p, key, item_id))["status"] not in ("completed", "failed", "cancelled"):
            await asyncio.sleep(0.2)
    return item


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


async def test_a_server_killed_mid_item_runs_it_again_and_it_completes_once(
    proc: Proc, http: aiohttp.ClientSession, fake_model: FakeModel,  # noqa: F811
) -> None:
    proc.env.update(FAST_QUEUE)
    key = await proc.start()
    status, body = await _call(http, proc, key, "POST", "/api/agents", json={"name": "helper",
                                                                             "systemPrompt": "You help."})
    assert status == 201, body
    # A slow reply: the server is killed while the model is still streaming it.
    fake_model.script("KILLED-MID-ITEM", [{"content": [_text("done after a while " * 3)], "delay": 0.1, "chunk": 2}])
    status, body = await _call(http, proc, key, "POST", "/api/queue",
                               json={"agentName": "helper", "prompt": "KILLED-MID-ITEM", "maxRetries": 0})
    assert status == 201, body
    item_id = body["item"]["id"]
    async with asyncio.timeout(60):
        while not fake_model.requests_containing("KILLED-MID-ITEM"):
            await asyncio.sleep(0.05)
    before = await _item(http, proc, key, item_id)
    assert before["status"] == "processing" and before["sessionId"]
    proc.kill()

    await proc.start()
    item = await _settled(http, proc, key, item_id)
    # It ran again (maxRetries 0: a server that died is not a failed attempt) and completed once.
    assert item["status"] == "completed" and item["retryCount"] == 0, item
    assert item["result"] == ("done after a while " * 3) and item["sessionId"] == before["sessionId"]
    assert len(fake_model.requests_containing("KILLED-MID-ITEM")) == 2
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{item['sessionId']}/messages")
    results = [c for m in body["messages"] if (c := json.loads(m["content"])).get("type") == "result"]
    assert [r.get("is_error") for r in results].count(False) == 1, results


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async for url in fresh_postgres():
        yield url


async def test_two_servers_on_one_postgres_run_each_item_exactly_once(
    short_tmp: Path, pg_url: str, http: aiohttp.ClientSession, fake_model: FakeModel,  # noqa: F811
) -> None:
    key = "ashd_" + secrets.token_hex(20)
    shared = {"SERVICE_API_KEY": key, "SERVICE_CREDENTIAL_KEY": secrets.token_hex(32),
              "SERVICE_QUEUE_CONCURRENCY": "2", "SERVICE_QUEUE_CONCURRENCY_PER_TENANT": "4", **FAST_QUEUE}
    servers = []
    for name in ("a", "b"):
        p = Proc(Settings(data_dir=str(short_tmp / name), database_url=pg_url), fake_model.url)
        p.env.update(shared)
        servers.append(p)
    try:
        for p in servers:
            with contextlib.suppress(FileNotFoundError):  # SERVICE_API_KEY set: no generated key file
                await p.start()
        a, b = servers
        status, body = await _call(http, a, key, "POST", "/api/agents", json={"name": "helper",
                                                                              "systemPrompt": "You help."})
        assert status == 201, body
        tokens = [f"ONCE-{i:02d}" for i in range(12)]
        for token in tokens:
            fake_model.script(token, [{"content": [_text(f"answer {token}")], "delay": 0.02}])
        ids = []
        for i, token in enumerate(tokens):  # added through both servers
            status, body = await _call(http, servers[i % 2], key, "POST", "/api/queue",
                                       json={"agentName": "helper", "prompt": token})
            assert status == 201, body
            ids.append(body["item"]["id"])

        items = [await _settled(http, b, key, item_id, timeout=180) for item_id in ids]
        assert [i["status"] for i in items] == ["completed"] * len(tokens), items
        assert [i["result"] for i in items] == [f"answer {t}" for t in tokens]
        assert len({i["sessionId"] for i in items}) == len(tokens)
        for token in tokens:
            assert len(fake_model.requests_containing(token)) == 1, token
        # Both servers took part: each counted the attempts it completed.
        ran = [await _completed_here(http, p) for p in servers]
        assert sum(ran) == len(tokens) and min(ran) > 0, ran
        status, body = await _call(http, a, key, "GET", "/api/queue/stats")
        assert body["stats"]["completed"] == len(tokens) and body["stats"]["processing"] == 0
    finally:
        for p in servers:
            p.stop()


async def _completed_here(http: aiohttp.ClientSession, p: Proc) -> int:  # noqa: F811
    async with http.get(f"{p.url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('ash_queue_attempts_total{outcome="completed"}'):
            return int(float(line.split()[-1]))
    return 0
