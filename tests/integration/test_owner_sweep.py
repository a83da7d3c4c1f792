"""The start-up sweep pauses only what the starting process owned: two standalone servers on one
PostgreSQL leave each other's live sessions alone, and a restart pauses its own. Rows with no owner
(from before owners were stamped) are paused only by a standalone server on SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.storage import Session
from ashd.storage._sessions import Sessions
from tests.conftest import Api, start_api
from tests.fixtures.databases import fresh_postgres

pytestmark = pytest.mark.sandbox
API_KEY = "owner-sweep-test-key-51c0e8a7d2f94b36"  # one key for servers sharing a database


def server_settings(data_dir: Path, db_url: str) -> Settings:
    return Settings(data_dir=str(data_dir), database_url=db_url, api_key=API_KEY, prewarm=0, zygote=False,
                    anthropic_base_url=None, rate_limit_rps=1000.0, rate_limit_burst=1000,
                    actor_timeout_seconds=30.0)


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async for url in fresh_postgres():
        yield url


async def create_session(api: Api) -> str:
    status, body = await api.call("POST", "/api/sessions", json={"agent": "helper"})
    assert status == 201, body
    assert body["session"]["status"] == "active" and body["session"]["runnerId"] is None
    return str(body["session"]["id"])


async def row(api: Api, sid: str) -> Session:
    assert api.server.components is not None
    return await Sessions(api.server.components.db).get("default", sid)


async def stop(api: Api) -> None:
    await api.client.close()
    await api.server.stop()


async def test_second_server_leaves_first_alone(aiohttp_client: Any, pg_url: str, short_tmp: Path) -> None:
    first_settings = server_settings(short_tmp / "a", pg_url)
    _, first = await start_api(aiohttp_client, first_settings)
    second: Api | None = None
    try:
        status, body = await first.call("POST", "/api/agents", json={"name": "helper", "systemPrompt": "Hi."})
        assert status == 201, body
        mine = await create_session(first)
        first_id = (short_tmp / "a" / "server-id").read_text().strip()
        assert (await row(first, mine)).owner_id == first_id
        assert first.server.components is not None
        legacy = (await Sessions(first.server.components.db).insert(
            Session(tenant_id="default", agent_name="helper", status="active"))).id  # no owner: from before

        _, second = await start_api(aiohttp_client, server_settings(short_tmp / "b", pg_url))
        second_id = (short_tmp / "b" / "server-id").read_text().strip()
        assert second_id != first_id
        # The second server's start paused nothing of the first's, nor the row nobody owns.
        assert (await row(second, mine)).status == "active"
        assert (await row(second, legacy)).status == "active"
        theirs = await create_session(second)
        assert (await row(second, theirs)).owner_id == second_id
        # The first server keeps serving its session.
        status, body = await first.call("GET", f"/api/sessions/{mine}")
        assert status == 200 and body["session"]["status"] == "active"

        await stop(first)  # a stop leaves rows as they are, as a crash does
        assert (await row(second, mine)).status == "active"
        _, first = await start_api(aiohttp_client, first_settings)  # the first's restart: its own paused
        assert (short_tmp / "a" / "server-id").read_text().strip() == first_id  # stable across restarts
        assert (await row(first, mine)).status == "paused"
        assert (await row(first, theirs)).status == "active"
        assert (await row(first, legacy)).status == "active"
        status, events = await first.call("GET", f"/api/sessions/{mine}/events?type=lifecycle")
        assert status == 200
        assert [e["data"] for e in events["events"]][-1] == \
            '{"action": "paused", "status": "paused", "reason": "restart"}'
    finally:
        await stop(first)
        if second is not None:
            await stop(second)


async def test_standalone_sqlite_pauses_unowned_rows(aiohttp_client: Any, short_tmp: Path) -> None:
    settings = server_settings(short_tmp / "d", f"sqlite+aiosqlite:///{short_tmp / 'd.db'}")
    _, api = await start_api(aiohttp_client, settings)
    try:
        assert api.server.components is not None
        legacy = (await Sessions(api.server.components.db).insert(
            Session(tenant_id="default", agent_name="helper", status="active"))).id
        other = (await Sessions(api.server.components.db).insert(
            Session(tenant_id="default", agent_name="helper", status="active", owner_id="srv-elsewhere"))).id
        await stop(api)
        _, api = await start_api(aiohttp_client, settings)
        assert (await row(api, legacy)).status == "paused"
        assert (await row(api, other)).status == "active"  # another owner's, even on SQLite
    finally:
        await stop(api)
