"""Health, metrics, auth, error shapes and key handling through real HTTP."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session as SyncSession

from ashd.config import Settings
from ashd.storage import ApiKey, Database, Session, service_counts
from tests.conftest import Api, start_api


async def test_health_is_public_and_complete(api: Api) -> None:
    resp = await api.client.get("/health")
    assert resp.status == 200
    body = await resp.json()
    assert body["status"] == "ok" and body["activeSessions"] == 0 and body["warnings"] == []
    for field in ("activeSessions", "activeSandboxes", "uptime", "pool", "version", "coordinatorId"):
        assert field in body
    for field in ("total", "cold", "warming", "warm", "waiting", "running", "maxCapacity",
                  "resumeWarmHits", "resumeColdHits", "preWarmHits"):
        assert isinstance(body["pool"][field], int)
    space = body["dataDir"]  # free space on the data dir's filesystem, and its state
    assert space["state"] in ("ok", "low", "full") and 0 < space["freeBytes"] <= space["totalBytes"]
    assert space["minFreeBytes"] == 256 * 1024 * 1024 and space["warnFreeBytes"] == 2048 * 1024 * 1024


async def test_service_counts_read_every_tenants_rows_on_both_databases(db_url: str) -> None:
    # What /health and /metrics read in one statement: the active sessions of every tenant, and
    # whether a tenant other than `default` holds a key (the agent-roots warning's condition).
    db = await Database.open(db_url)
    try:
        counts = await service_counts(db)
        assert (counts.active_sessions, counts.other_tenants) == (0, False)

        def add(s: SyncSession, tenant: str, statuses: tuple[str, ...]) -> None:
            s.add(ApiKey(tenant_id=tenant, key_hash=f"h-{tenant}", key_prefix="p"))
            for i, status in enumerate(statuses):
                s.add(Session(id=f"{tenant}-{i}", tenant_id=tenant, agent_name="a", config="{}", status=status))

        await db.run_tx(lambda s: add(s, "default", ("active", "paused", "ended", "active")))
        counts = await service_counts(db)
        assert (counts.active_sessions, counts.other_tenants) == (2, False)
        await db.run_tx(lambda s: add(s, "acme", ("active", "starting")))
        counts = await service_counts(db)
        assert (counts.active_sessions, counts.other_tenants) == (3, True)
    finally:
        await db.close()


async def test_metrics_exact_content_type_and_series(api: Api) -> None:
    resp = await api.client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = await resp.text()
    for series in ("ash_up 1.0", "ash_uptime_seconds", "ash_active_sessions", "ash_active_sandboxes",
                   'ash_pool_sandboxes{state="cold"}', 'ash_pool_sandboxes{state="running"}',
                   "ash_pool_max_capacity", 'ash_resume_total{path="warm"}', 'ash_resume_total{path="cold"}',
                   "ash_data_dir_free_bytes", "ash_data_dir_size_bytes"):
        assert series in text
    assert "_created" not in text


async def test_auth_errors(api: Api) -> None:
    resp = await api.client.get("/api/agents")
    assert resp.status == 401
    assert await resp.json() == {"error": "Missing Authorization header", "statusCode": 401}
    resp = await api.client.get("/api/agents", headers={"Authorization": "Token abc"})
    assert (await resp.json())["error"] == "Invalid Authorization header format"
    resp = await api.client.get("/api/agents", headers={"Authorization": "Bearer nope"})
    assert resp.status == 401
    assert (await resp.json())["error"] == "Invalid API key"


async def test_unknown_route_wrong_method_bad_json_are_api_errors(api: Api) -> None:
    status, body = await api.call("GET", "/api/does-not-exist")
    assert status == 404 and body["statusCode"] == 404
    status, body = await api.call("DELETE", "/health")
    assert status == 405 and body["statusCode"] == 405 and "allowed" in body["error"]
    status, body = await api.call("POST", "/api/api-keys", data="{not json", headers={"Content-Type": "application/json"})
    assert status in (400,) and body["statusCode"] == 400


async def test_oversized_body_is_413(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings.with_(max_body_bytes=2048))
    try:
        status, body = await api.call("POST", "/api/api-keys", data="x" * 5000,
                                      headers={"Content-Type": "application/json"})
        assert status == 413 and body["statusCode"] == 413
    finally:
        await api.client.close()
        await server.stop()


async def test_rate_limit_429_with_retry_after(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings.with_(rate_limit_rps=0.5, rate_limit_burst=2))
    try:
        statuses = []
        for _ in range(3):
            resp = await api.client.get("/api/api-keys", headers=api.headers())
            statuses.append(resp.status)
        assert statuses[:2] == [200, 200]
        assert statuses[2] == 429
        assert int(resp.headers["Retry-After"]) >= 1
        assert (await resp.json())["statusCode"] == 429
        # health is never limited
        assert (await api.client.get("/health")).status == 200
    finally:
        await api.client.close()
        await server.stop()


async def test_initial_key_file_and_restart_reuses_db_and_key(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings)
    key_file = Path(settings.data_dir) / "initial-api-key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    first_key = api.key
    assert (await api.call("GET", "/api/api-keys"))[0] == 200
    await api.client.close()
    await server.stop()

    server, api = await start_api(aiohttp_client, settings)
    try:
        assert api.key == first_key
        status, body = await api.call("GET", "/api/api-keys")
        assert status == 200 and len(body["keys"]) == 1
    finally:
        await api.client.close()
        await server.stop()


async def test_service_api_key_maps_to_default_tenant(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings.with_(api_key="configured-key-123456"))
    try:
        status, _ = await api.call("GET", "/api/api-keys", key="configured-key-123456")
        assert status == 200
    finally:
        await api.client.close()
        await server.stop()


async def test_key_never_logged(aiohttp_client: Any, settings: Settings, caplog: Any) -> None:
    caplog.set_level("DEBUG")
    server, api = await start_api(aiohttp_client, settings)
    try:
        await api.call("GET", "/api/api-keys")
        assert api.key not in caplog.text
    finally:
        await api.client.close()
        await server.stop()


async def test_api_keys_lifecycle_and_tenants(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings.with_(internal_secret="s3cret"))
    try:
        status, body = await api.call("POST", "/api/api-keys", json={"label": "ci"})
        assert status == 201 and body["key"].startswith("ashd_")
        new_key, new_id = body["key"], body["id"]
        status, body = await api.call("GET", "/api/api-keys", key=new_key)
        listed = {k["id"]: k for k in body["keys"]}
        assert new_id in listed and listed[new_id]["label"] == "ci"
        assert all("key" not in k for k in body["keys"])  # only the prefix is ever shown
        assert listed[new_id]["keyPrefix"] == new_key[:8]  # "ashd_" and 3 random characters, no more

        # operators mint keys for other tenants with the internal secret
        status, body = await api.call("POST", "/api/internal/api-keys", json={"tenantId": "acme"},
                                      headers={"Authorization": "Bearer s3cret"})
        assert status == 201 and body["tenantId"] == "acme"
        acme_key = body["key"]
        status, body = await api.call("GET", "/api/api-keys", key=acme_key)
        assert [k["id"] for k in body["keys"]] == [body["keys"][0]["id"]] and new_id not in {k["id"] for k in body["keys"]}
        status, body = await api.call("DELETE", f"/api/api-keys/{new_id}", key=acme_key)
        assert status == 404  # another tenant's key

        status, body = await api.call("DELETE", f"/api/api-keys/{new_id}")
        assert status == 200 and body == {"ok": True}
        status, body = await api.call("GET", "/api/api-keys", key=new_key)
        assert status == 401 and body["error"] == "Invalid API key"  # revoked at once on this server
        status, body = await api.call("POST", "/api/internal/api-keys", json={"tenantId": "x"})
        assert status == 401
    finally:
        await api.client.close()
        await server.stop()
