"""Internal runner endpoints: the internal secret, register/heartbeat/deregister, bulk pause."""

from __future__ import annotations

from typing import Any

from ashd.config import Settings
from ashd.storage import Session
from ashd.storage._sessions import Sessions
from tests.conftest import start_api

SECRET = "internal-secret-for-tests"


async def test_runner_registry_and_secret(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, settings.with_(internal_secret=SECRET))
    try:
        status, body = await api.call("GET", "/api/internal/runners")  # an API key is not the secret
        assert status == 401 and body["error"] == "Invalid internal secret"
        resp = await api.client.get("/api/internal/runners")
        assert resp.status == 401
        secret = {"Authorization": f"Bearer {SECRET}"}
        reg = {"runnerId": "r1", "host": "10.0.0.5", "port": 4200, "maxSandboxes": 8}
        status, body = await api.call("POST", "/api/internal/runners/register", json=reg, headers=secret)
        assert status == 200 and body == {"ok": True}
        status, body = await api.call("POST", "/api/internal/runners/register", json={**reg, "port": 4300},
                                      headers=secret)  # re-register = upsert
        status, body = await api.call("GET", "/api/internal/runners", headers=secret)
        assert body["count"] == 1 and body["runners"][0]["port"] == 4300 and body["hasLocal"] is True
        hb = {"runnerId": "r1", "stats": {"running": 2, "warming": 1}, "activeCount": 3}
        status, body = await api.call("POST", "/api/internal/runners/heartbeat", json=hb, headers=secret)
        assert status == 200
        status, body = await api.call("POST", "/api/internal/runners/heartbeat", json={**hb, "runnerId": "nope"},
                                      headers=secret)
        assert status == 404 and body["statusCode"] == 404
        status, body = await api.call("POST", "/api/internal/runners/register", json={"runnerId": "r2"},
                                      headers=secret)
        assert status == 400

        services = server.components
        assert services is not None
        repo = Sessions(services.db)
        on_runner = await repo.insert(Session(tenant_id="default", agent_name="a", status="active", runner_id="r1"))
        elsewhere = await repo.insert(Session(tenant_id="default", agent_name="a", status="active", runner_id="r9"))
        status, body = await api.call("POST", "/api/internal/runners/deregister", json={"runnerId": "r1"},
                                      headers=secret)
        assert status == 200 and body["pausedSessions"] == 1
        assert (await repo.get("default", on_runner.id)).status == "paused"
        assert (await repo.get("default", elsewhere.id)).status == "active"
        status, body = await api.call("GET", "/api/internal/runners", headers=secret)
        assert body["count"] == 0
    finally:
        await api.client.close()
        await server.stop()
