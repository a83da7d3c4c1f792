"""Everything a tenant can make the server store is bounded: one test per limit and its refusal, and
GET /api/storage telling a tenant what it holds. Real HTTP, real sandboxes, the fake model."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session as SyncSession

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from ashd.storage import Agent, ApiKey, Attachment, Credential, Database, Message, Session, SessionEvent
from ashd.storage._agent_archive import AGENT_ID_FILE
from ashd.storage._holdings import Holdings, TenantStorage
from ashd.storage._snapshots import SnapshotBoard, make_key
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, send

MIB = 1024 * 1024


def base_settings(short_tmp: Path, fake_url: str | None) -> Settings:
    return Settings(data_dir=str(short_tmp / "data"), prewarm=0, zygote=True, anthropic_base_url=fake_url,
                    anthropic_api_key="sk-ant-test", rate_limit_rps=1000.0, rate_limit_burst=1000,
                    actor_timeout_seconds=30.0)


@pytest.fixture
async def lapi(aiohttp_client: Any, short_tmp: Path, fake_model: FakeModel,  # noqa: F811
               request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """A server on SQLite with the limits the test asks for (indirect parametrisation)."""
    server, api = await start_api(aiohttp_client, base_settings(short_tmp, fake_model.url).with_(**request.param))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


def limits(**changes: Any) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("lapi", [changes], indirect=True)


async def _get(api: Api, path: str, key: str | None = None) -> Any:
    status, body = await api.call("GET", path, key=key)
    assert status == 200, (path, body)
    return body


def _upload(name: str, size: int) -> dict[str, Any]:
    blob = base64.b64encode(os.urandom(size)).decode()  # random: nothing compresses it away
    return {"name": name, "systemPrompt": "You are helpful.",
            "files": [{"path": "data.bin", "content": blob, "encoding": "base64"}]}


# --- turns ---------------------------------------------------------------------------------------

@pytest.mark.sandbox
@limits(turn_max_stored_mb=1)
async def test_a_turn_stops_at_its_stored_bytes_limit(lapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    fake_model.script("big-answer", [{"content": [{"type": "text", "text": "B" * 400_000}], "chunk": 100_000}])
    await deploy(lapi)
    sid = (await create(lapi))["id"]
    status, frames = await send(lapi, sid, "big-answer please")
    assert status == 200
    assert [f.event for f in frames] == ["error", "done"]
    assert "SERVICE_TURN_MAX_STORED_MB" in frames[0].data["error"] and frames[0].id is not None
    assert frames[-1].id is not None  # the turn ended cleanly and is stored
    events = (await _get(lapi, f"/api/sessions/{sid}/events?limit=1000"))["events"]
    assert not any("B" * 1000 in (e["data"] or "") for e in events)
    assert [json.loads(e["data"])["error"] for e in events if e["type"] == "error"] == [frames[0].data["error"]]
    status, frames = await send(lapi, sid, "small now")  # the session goes on
    assert status == 200 and [f.event for f in frames][-1] == "done" and "error" not in [f.event for f in frames]


@pytest.mark.sandbox
@limits(turn_max_events=10)
async def test_a_turn_stops_at_its_event_limit(lapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    fake_model.script("many-blocks", [{"content": [{"type": "text", "text": f"part {i}"} for i in range(12)]}])
    await deploy(lapi)
    sid = (await create(lapi))["id"]
    status, frames = await send(lapi, sid, "many-blocks please")
    assert status == 200
    assert [f.event for f in frames] == ["error", "done"]
    assert "SERVICE_TURN_MAX_EVENTS" in frames[0].data["error"]
    texts = [e for e in (await _get(lapi, f"/api/sessions/{sid}/events?type=text"))["events"]]
    assert texts == []


# --- snapshots -----------------------------------------------------------------------------------

def _keys(api: Api, sid: str) -> list[str]:
    return sorted(os.listdir(Path(api.server.settings.data_dir) / "snapshots" / sid))


@pytest.mark.sandbox
@limits(snapshot_max_mb=1)
async def test_a_workspace_over_the_snapshot_limit_is_refused_and_the_previous_snapshot_kept(lapi: Api) -> None:
    await deploy(lapi)
    sid = (await create(lapi))["id"]
    assert (await lapi.call("POST", f"/api/sessions/{sid}/stop"))[0] == 200
    first = _keys(lapi, sid)
    assert len(first) == 1
    assert (await lapi.call("POST", f"/api/sessions/{sid}/resume"))[0] == 200
    workspace = await lapi.server.components.local.registry.workspace("default", sid)  # type: ignore[union-attr]
    (workspace / "big.bin").write_bytes(os.urandom(2 * MIB))

    status, body = await lapi.call("POST", f"/api/sessions/{sid}/stop")
    assert status == 413 and "SERVICE_SNAPSHOT_MAX_MB" in body["error"] and "previous one" in body["error"]
    assert (await _get(lapi, f"/api/sessions/{sid}"))["session"]["status"] == "active"  # nothing was lost
    assert _keys(lapi, sid) == first  # no partial file left, the previous snapshot untouched

    status, body = await lapi.call("DELETE", f"/api/sessions/{sid}")  # ending is not refused
    assert status == 200 and body["session"]["status"] == "ended"
    events = (await _get(lapi, f"/api/sessions/{sid}/events?type=lifecycle"))["events"]
    ended = json.loads(events[-1]["data"])
    assert ended["action"] == "ended" and "SERVICE_SNAPSHOT_MAX_MB" in ended["snapshot"]
    files = (await _get(lapi, f"/api/sessions/{sid}/files"))["files"]
    assert "AGENT.md" in [f["path"] for f in files] and "big.bin" not in [f["path"] for f in files]


@pytest.mark.sandbox
@limits(snapshots_keep=2)
async def test_snapshots_kept_per_session(lapi: Api) -> None:
    await deploy(lapi)
    sid = (await create(lapi))["id"]
    for _ in range(3):
        assert (await lapi.call("POST", f"/api/sessions/{sid}/stop"))[0] == 200
        assert (await lapi.call("POST", f"/api/sessions/{sid}/resume"))[0] == 200
    keys = _keys(lapi, sid)
    assert len(keys) == 2
    held = (await _get(lapi, "/api/storage"))["storage"]["snapshots"]
    directory = Path(lapi.server.settings.data_dir) / "snapshots" / sid
    assert held["count"] == 2 and held["bytes"] == sum((directory / k).stat().st_size for k in keys)
    assert held["keepPerSession"] == 2


# --- agents, credentials, keys ---------------------------------------------------------------------

@limits(agent_max_upload_mb=1)
async def test_an_agent_upload_over_the_limit_is_413(lapi: Api) -> None:
    status, body = await lapi.call("POST", "/api/agents", json=_upload("big", 1_200_000))
    assert status == 413 and "SERVICE_AGENT_MAX_UPLOAD_MB" in body["error"], body
    assert not (Path(lapi.server.settings.data_dir) / "agents" / "default" / "big").exists()
    status, body = await lapi.call("POST", "/api/agents", json=_upload("big", 900_000))
    assert status == 201, body


@limits(tenant_max_agents=2)
async def test_agents_per_tenant_are_limited(lapi: Api) -> None:
    for name in ("a1", "a2"):
        assert (await lapi.call("POST", "/api/agents", json={"name": name, "systemPrompt": "hi"}))[0] == 201
    status, body = await lapi.call("POST", "/api/agents", json={"name": "a3", "systemPrompt": "hi"})
    assert status == 409 and "SERVICE_TENANT_MAX_AGENTS" in body["error"], body
    assert (await lapi.call("POST", "/api/agents", json={"name": "a2", "systemPrompt": "v2"}))[0] == 201  # redeploy
    other = await lapi.new_tenant_key("acme")
    assert (await lapi.call("POST", "/api/agents", key=other, json={"name": "a3", "systemPrompt": "hi"}))[0] == 201
    assert (await lapi.call("DELETE", "/api/agents/a1"))[0] == 200
    assert (await lapi.call("POST", "/api/agents", json={"name": "a3", "systemPrompt": "hi"}))[0] == 201


@limits(tenant_max_credentials=1, tenant_max_api_keys=2)
async def test_credentials_and_api_keys_per_tenant_are_limited(lapi: Api) -> None:
    cred = {"type": "custom", "key": "k"}
    assert (await lapi.call("POST", "/api/credentials", json=cred))[0] == 201
    status, body = await lapi.call("POST", "/api/credentials", json=cred)
    assert status == 409 and "SERVICE_TENANT_MAX_CREDENTIALS" in body["error"], body
    assert (await lapi.call("POST", "/api/api-keys", json={}))[0] == 201  # the first start made one already
    status, body = await lapi.call("POST", "/api/api-keys", json={})
    assert status == 409 and "SERVICE_TENANT_MAX_API_KEYS" in body["error"], body
    assert len((await _get(lapi, "/api/api-keys"))["keys"]) == 2


# --- the tenant's total ------------------------------------------------------------------------------

@limits(tenant_storage_mb=1)
async def test_the_tenant_storage_limit_covers_agent_uploads(lapi: Api) -> None:
    assert (await lapi.call("POST", "/api/agents", json=_upload("first", 600_000)))[0] == 201
    held = (await _get(lapi, "/api/storage"))["storage"]
    assert held["agents"]["bytes"] >= 600_000 and held["limitBytes"] == MIB
    status, body = await lapi.call("POST", "/api/agents", json=_upload("second", 600_000))
    assert status == 409 and "SERVICE_TENANT_STORAGE_MB" in body["error"], body
    other = await lapi.new_tenant_key("acme")  # another tenant has its own room
    assert (await lapi.call("POST", "/api/agents", key=other, json=_upload("second", 600_000)))[0] == 201
    assert (await lapi.call("DELETE", "/api/agents/first"))[0] == 200
    assert (await _get(lapi, "/api/storage"))["storage"]["agents"]["bytes"] == 0
    assert (await lapi.call("POST", "/api/agents", json=_upload("second", 600_000)))[0] == 201


@pytest.mark.sandbox
@limits(tenant_storage_mb=1)
async def test_the_tenant_storage_limit_covers_history_and_purge_frees_it(
        lapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    fake_model.script("long-reply", [{"content": [{"type": "text", "text": "L" * 400_000}], "chunk": 100_000}])
    await deploy(lapi)
    sid = (await create(lapi))["id"]
    assert (await send(lapi, sid, "long-reply please"))[0] == 200  # stored: about 1.2 MiB
    held = (await _get(lapi, "/api/storage"))["storage"]
    assert held["history"]["bytes"] > MIB and held["totalBytes"] > MIB
    status, body = await send(lapi, sid, "one more")
    assert status == 409 and "SERVICE_TENANT_STORAGE_MB" in body[0]["error"], body
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "helper"})
    assert status == 409, body

    status, body = await lapi.call("DELETE", f"/api/sessions/{sid}?purge=true")
    assert status == 200 and body["session"]["status"] == "ended"
    assert (await lapi.call("GET", f"/api/sessions/{sid}"))[0] == 404
    assert not (Path(lapi.server.settings.data_dir) / "snapshots" / sid).exists()
    held = (await _get(lapi, "/api/storage"))["storage"]
    assert held["history"] == {**held["history"], "messages": 0, "events": 0, "bytes": 0}
    assert held["sessions"]["count"] == 0 and held["snapshots"]["count"] == 0
    sid = (await create(lapi))["id"]
    assert (await send(lapi, sid, "fresh start"))[0] == 200


# --- what a tenant holds -----------------------------------------------------------------------------

@pytest.mark.sandbox
async def test_storage_reports_what_the_tenant_holds(aiohttp_client: Any, settings: Settings,
                                                      fake_model: FakeModel) -> None:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test"))
    try:
        assert (await api.call("POST", "/api/agents", json=_upload("helper", 50_000)))[0] == 201
        sids = [(await create(api))["id"] for _ in range(2)]
        for sid in sids:
            assert (await send(api, sid, "hello there"))[0] == 200
        assert (await api.call("POST", f"/api/sessions/{sids[0]}/stop"))[0] == 200

        held = (await _get(api, "/api/storage"))["storage"]
        data = Path(settings.data_dir)
        agent_dir = data / "agents" / "default" / "helper"
        assert held["agents"]["count"] == 1
        # The agent's files, not the cache's own marker of which agent its versions belong to.
        assert held["agents"]["bytes"] == sum(p.stat().st_size for p in agent_dir.rglob("*")
                                              if p.is_file() and p.name != AGENT_ID_FILE)
        assert held["sessions"]["count"] == 2
        services = api.server.components
        assert services is not None
        async with services.db.read() as s:
            contents = (await s.execute(select(Message.content).where(Message.session_id.in_(sids)))).scalars().all()
            events = (await s.execute(select(SessionEvent.data, SessionEvent.frame_data)
                                      .where(SessionEvent.session_id.in_(sids)))).all()
            configs = (await s.execute(select(Session.config).where(Session.id.in_(sids)))).scalars().all()
        listed = [m for sid in sids for m in (await _get(api, f"/api/sessions/{sid}/messages"))["messages"]]
        assert held["history"]["messages"] == len(contents) == len(listed)
        assert held["history"]["events"] == len(events)
        assert held["history"]["bytes"] == (sum(len(c.encode()) for c in contents)
                                            + sum(len((d or "").encode()) + len((f or "").encode()) for d, f in events)
                                            + sum(len(c.encode()) for c in configs))
        snap = data / "snapshots" / sids[0]
        assert held["snapshots"]["count"] == 1
        assert held["snapshots"]["bytes"] == sum(p.stat().st_size for p in snap.iterdir())
        assert held["totalBytes"] == held["agents"]["bytes"] + held["history"]["bytes"] + held["snapshots"]["bytes"]
        assert held["credentials"]["count"] == 0 and held["apiKeys"]["count"] == 1

        other = await api.new_tenant_key("acme")  # tenant-scoped: another tenant holds nothing
        theirs = (await _get(api, "/api/storage", key=other))["storage"]
        assert theirs["tenantId"] == "acme" and theirs["totalBytes"] == 0 and theirs["sessions"]["count"] == 0
    finally:
        await api.client.close()
        await server.stop()


async def test_holdings_sum_each_tenants_own_rows_on_both_databases(db_url: str, tmp_path: Path) -> None:
    # The sums behind GET /api/storage and the 409, as one prebuilt statement with the tenant bound:
    # each tenant's rows only, on SQLite and on PostgreSQL.
    db = await Database.open(db_url)
    board = SnapshotBoard()
    store = TenantStorage(db, board, Settings())
    try:
        def add(s: SyncSession) -> None:
            sessions: list[tuple[str, str]] = []
            for tenant, n in (("t1", 3), ("t2", 1)):
                s.add(Agent(tenant_id=tenant, name="a", path="/x", stored_bytes=1000 * n))
                s.add(ApiKey(tenant_id=tenant, key_hash=f"h-{tenant}", key_prefix="p"))
                for i in range(n):
                    sid = f"{tenant}-{i:032d}"[:36]
                    sessions.append((tenant, sid))
                    s.add(Session(id=sid, tenant_id=tenant, agent_name="a", config="{}", message_count=2,
                                  event_count=5, stored_bytes=700))
            s.add(Credential(tenant_id="t1", type="anthropic", secret_ciphertext=b"x"))
            s.flush()  # the sessions before the attachments that name them
            for tenant, sid in sessions:
                s.add(Attachment(tenant_id=tenant, session_id=sid, filename="f", mime_type="text/plain", size=50))

        await db.run_tx(add)
        session_dir = tmp_path / "snap"
        session_dir.mkdir()
        (session_dir / make_key(1, 1)).write_bytes(b"s" * 300)
        board.refresh(f"t1-{0:032d}"[:36], session_dir)
        board.refresh(f"t2-{0:032d}"[:36], session_dir)

        t1 = await store.holdings("t1")
        assert (t1.agents, t1.agent_bytes, t1.sessions, t1.messages, t1.events, t1.history_bytes) == \
            (1, 3000, 3, 6, 15, 2100)
        assert (t1.credentials, t1.api_keys, t1.attachments, t1.attachment_bytes) == (1, 1, 3, 150)
        assert (t1.snapshots, t1.snapshot_bytes) == (1, 300)
        assert t1.total_bytes == 3000 + 2100 + 150 + 300
        t2 = await store.holdings("t2")
        assert (t2.agents, t2.sessions, t2.history_bytes, t2.credentials, t2.attachments) == (1, 1, 700, 0, 1)
        assert t2.snapshots == 1
        assert await store.holdings("nobody") == Holdings()
    finally:
        await db.close()


async def test_a_stale_sum_that_leaves_room_admits_at_once_and_a_new_one_is_taken_beside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tenant's total is a sum over its sessions (12 ms at 10,000 on SQLite): a request that
    finds the last sum stale but recent, with room in it, goes on at once and the sum is taken
    again beside it; past the stale window, or without room, the request waits for a new sum."""
    from ashd.errors import QuotaExceeded
    from ashd.storage import _holdings

    monkeypatch.setattr(_holdings, "_CACHE_SECONDS", 0.05)
    monkeypatch.setattr(_holdings, "_STALE_SECONDS", 1.0)
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")
    store = TenantStorage(db, None, Settings().with_(tenant_storage_mb=1))

    async def stores(n: int) -> None:  # what a turn, or another server on the same database, stores
        await db.run_tx(lambda s: s.add(Session(id=f"s{n}", tenant_id="t", agent_name="a", config="{}",
                                                stored_bytes=600_000)))

    try:
        await stores(1)
        await store.require_room("t", "a new message")  # summed on the request: nothing was cached
        await stores(2)  # the tenant is now over its MiB; the cached sum does not know yet
        await asyncio.sleep(0.1)
        await store.require_room("t", "a new message")  # admitted at once from the stale sum...
        assert "t" in store._refreshing  # ...which is being taken again beside it
        await asyncio.wait_for(store._refreshing["t"], 10)
        with pytest.raises(QuotaExceeded):  # the new sum: over the limit
            await store.require_room("t", "a new message")

        await db.run_tx(lambda s: s.execute(update(Session).where(Session.id == "s2").values(stored_bytes=0)))
        await store.require_room("t", "a new message")  # no room in the last sum: summed again, at once
        await stores(3)
        await asyncio.sleep(1.1)  # past the stale window: the request waits for a new sum
        with pytest.raises(QuotaExceeded):
            await store.require_room("t", "a new message")
        assert "t" not in store._refreshing
    finally:
        await db.close()
