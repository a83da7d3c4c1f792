"""API key revocation across real restarts (a second server on the same data dir and database):
the SERVICE_API_KEY key is revoked only by changing the setting; a revoked key stays revoked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ashd.app import Server
from ashd.config import Settings
from ashd.http import _key_cache
from tests.conftest import Api, start_api

ENV_KEY = "env-key-0123456789-abcdefghijklmnop"
NEW_ENV_KEY = "env-key-rotated-9876543210-zyxwvuts"


async def _restart(aiohttp_client: Any, settings: Settings, previous: Api | None) -> Api:
    if previous is not None:
        await previous.client.close()
        await previous.server.stop()
    _, api = await start_api(aiohttp_client, settings)
    return api


async def _key_id(api: Api, label: str) -> str:
    status, body = await api.call("GET", "/api/api-keys")
    assert status == 200, body
    return str(next(k["id"] for k in body["keys"] if k["label"] == label))


async def test_env_key_cannot_be_revoked_and_revoked_keys_stay_revoked(aiohttp_client: Any,
                                                                       settings: Settings) -> None:
    settings = settings.with_(api_key=ENV_KEY)
    api = await _restart(aiohttp_client, settings, None)
    try:
        env_id = await _key_id(api, "SERVICE_API_KEY")
        status, body = await api.call("DELETE", f"/api/api-keys/{env_id}")
        assert status == 409, body
        assert body["statusCode"] == 409 and "SERVICE_API_KEY" in body["error"]
        status, body = await api.call("GET", "/api/api-keys")
        assert status == 200  # the refused revocation changed nothing

        status, minted = await api.call("POST", "/api/api-keys", json={"label": "ci"})
        assert status == 201
        assert (await api.call("GET", "/api/api-keys", key=minted["key"]))[0] == 200
        status, body = await api.call("DELETE", f"/api/api-keys/{minted['id']}")
        assert status == 200 and body == {"ok": True}

        api = await _restart(aiohttp_client, settings, api)
        status, body = await api.call("GET", "/api/api-keys", key=minted["key"])
        assert status == 401 and body["error"] == "Invalid API key"  # still revoked after the restart
        assert (await api.call("GET", "/api/api-keys"))[0] == 200  # the env key still works

        # Changing the setting is how the env key is revoked: the old value stops working.
        api = await _restart(aiohttp_client, settings.with_(api_key=NEW_ENV_KEY), api)
        assert (await api.call("GET", "/api/api-keys", key=ENV_KEY))[0] == 401
        status, body = await api.call("GET", "/api/api-keys", key=NEW_ENV_KEY)
        assert status == 200 and [k["label"] for k in body["keys"]].count("SERVICE_API_KEY") == 1

        # Unsetting it revokes it too (and no stray key remains: a fresh initial key is generated).
        api = await _restart(aiohttp_client, settings.with_(api_key=None), api)
        assert (await api.call("GET", "/api/api-keys", key=NEW_ENV_KEY))[0] == 401
        assert (await api.call("GET", "/api/api-keys"))[0] == 200  # api.key: the new initial key
        assert api.key not in (ENV_KEY, NEW_ENV_KEY)
    finally:
        await api.client.close()
        await api.server.stop()


async def test_revoked_generated_key_stays_revoked(aiohttp_client: Any, settings: Settings) -> None:
    api = await _restart(aiohttp_client, settings, None)
    try:
        initial = api.key
        status, minted = await api.call("POST", "/api/api-keys", json={"label": "successor"})
        assert status == 201
        initial_id = await _key_id(api, "initial key")
        status, _ = await api.call("DELETE", f"/api/api-keys/{initial_id}", key=minted["key"])
        assert status == 200
        api = await _restart(aiohttp_client, settings, api)
        assert (await api.call("GET", "/api/api-keys", key=initial))[0] == 401
        status, body = await api.call("GET", "/api/api-keys", key=minted["key"])
        assert status == 200 and [k["label"] for k in body["keys"]] == ["successor"]  # nothing re-minted
    finally:
        await api.client.close()
        await api.server.stop()


async def test_a_key_revoked_on_another_server_stops_working_when_its_cache_entry_expires(
        aiohttp_client: Any, settings: Settings, short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two servers on one database (two coordinators): a key revoked on one stops working on the
    # other once the other's cached verification expires. The TTL is shortened to keep this quick.
    monkeypatch.setattr(_key_cache, "_CACHE_TTL", 0.5)
    api = await _restart(aiohttp_client, settings, None)
    other_server = Server(settings.with_(data_dir=str(short_tmp / "other")))
    await other_server.start_components()
    assert other_server.app is not None
    other = Api(await aiohttp_client(other_server.app), other_server, api.key)
    try:
        status, minted = await api.call("POST", "/api/api-keys", json={"label": "shared"})
        assert status == 201
        assert (await api.call("GET", "/api/api-keys", key=minted["key"]))[0] == 200  # now cached here
        status, _ = await other.call("DELETE", f"/api/api-keys/{minted['id']}")
        assert status == 200
        assert (await other.call("GET", "/api/api-keys", key=minted["key"]))[0] == 401  # at once there
        async with asyncio.timeout(30):  # and here once the cached entry expires, not never
            while (await api.call("GET", "/api/api-keys", key=minted["key"]))[0] != 401:
                await asyncio.sleep(0.05)
        status, body = await api.call("GET", "/api/api-keys", key=minted["key"])
        assert status == 401 and body["error"] == "Invalid API key"
    finally:
        await other.client.close()
        await other_server.stop()
        await api.client.close()
        await api.server.stop()
