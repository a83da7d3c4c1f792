"""`ash-ai-sdk`'s own queue functions (`ash_sdk.api.queue`) against a real ashd: every answer parses
into the client's generated models, with the values the server meant."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import pytest
from ash_sdk.api.queue import (  # type: ignore[import-untyped]
    delete_api_queue_id,
    get_api_queue,
    get_api_queue_id,
    get_api_queue_stats,
    post_api_queue,
)
from ash_sdk.client import AuthenticatedClient  # type: ignore[import-untyped]
from ash_sdk.models import (  # type: ignore[import-untyped]
    ApiError,
    DeleteApiQueueIdResponse200,
    GetApiQueueIdResponse200,
    GetApiQueueResponse200,
    GetApiQueueStatsResponse200,
    PostApiQueueBody,
    PostApiQueueResponse201,
    QueueItem,
)

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import deploy

pytestmark = pytest.mark.sandbox


@pytest.fixture
async def one_at_a_time(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> Any:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        queue_concurrency=1))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def test_sdk_queue_functions_parse_every_answer(one_at_a_time: Api, fake_model: FakeModel) -> None:  # noqa: F811
    api = one_at_a_time
    await deploy(api)
    fake_model.script("SDK-SLOW", [{"content": [{"type": "text", "text": "slow " * 30}], "delay": 0.05, "chunk": 2}])
    fake_model.script("SDK-FAST", [{"content": [{"type": "text", "text": "queued answer"}]}])
    client = AuthenticatedClient(base_url=str(api.client.make_url("")).rstrip("/"), token=api.key,
                                 raise_on_unexpected_status=True)

    def run() -> None:
        slow = post_api_queue.sync(client=client, body=PostApiQueueBody(agent_name="helper", prompt="SDK-SLOW"))
        assert isinstance(slow, PostApiQueueResponse201) and isinstance(slow.item, QueueItem)
        assert slow.item.status == "pending" and slow.item.priority == 0 and slow.item.max_retries == 3
        assert slow.item.tenant_id == "default" and slow.item.created_at.tzinfo is not None
        fast = post_api_queue.sync(client=client, body=PostApiQueueBody(
            agent_name="helper", prompt="SDK-FAST", priority=5, max_retries=1)).item
        assert fast.priority == 5 and fast.max_retries == 1
        doomed = post_api_queue.sync(client=client, body=PostApiQueueBody(
            agent_name="helper", prompt="SDK-DOOMED", priority=-1)).item

        cancelled = delete_api_queue_id.sync(doomed.id, client=client)
        assert isinstance(cancelled, DeleteApiQueueIdResponse200) and cancelled.item.status == "cancelled"
        again = delete_api_queue_id.sync(doomed.id, client=client)
        assert isinstance(again, ApiError) and again.status_code == 400 and "pending" in again.error
        missing = get_api_queue_id.sync(UUID("0f0e0d0c-0000-4000-8000-000000000000"), client=client)
        assert isinstance(missing, ApiError) and missing.status_code == 404
        bad = post_api_queue.sync(client=client, body=PostApiQueueBody(agent_name="nobody", prompt="x"))
        assert isinstance(bad, ApiError) and bad.status_code == 400 and "nobody" in bad.error

        deadline = time.monotonic() + 60
        while (got := get_api_queue_id.sync(fast.id, client=client)).item.status != "completed":
            assert isinstance(got, GetApiQueueIdResponse200) and got.item.status in ("pending", "processing")
            assert time.monotonic() < deadline, got
            time.sleep(0.1)
        assert got.item.id == fast.id and got.item["result"] == "queued answer"
        assert isinstance(got.item.session_id, str) and got.item.started_at and got.item.completed_at
        assert got.item.error is None and got.item.retry_count == 0

        listed = get_api_queue.sync(client=client)
        assert isinstance(listed, GetApiQueueResponse200)
        assert [i.id for i in listed.items] == [doomed.id, fast.id, slow.item.id]  # newest first
        only = get_api_queue.sync(client=client, status="cancelled", limit=10)
        assert [i.id for i in only.items] == [doomed.id]

        stats = get_api_queue_stats.sync(client=client)
        assert isinstance(stats, GetApiQueueStatsResponse200)
        assert stats.stats.cancelled == 1 and stats.stats.failed == 0
        assert stats.stats.pending + stats.stats.processing + stats.stats.completed == 2

    await asyncio.to_thread(run)
