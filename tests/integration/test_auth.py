"""The auth middleware (http/_auth.py) through real HTTP on a real server: which paths are open,
what each malformed or wrong credential gets, the internal secret, the rate limit's edge, and a key
that keeps working when its last-use timestamp cannot be written.

SQLite only: the middleware's decisions do not depend on the database (test_foundation.py runs
the same paths on PostgreSQL too), and these run for every mutant of the module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text

from ashd.config import Settings
from ashd.http import _ratelimit
from tests.conftest import Api, start_api

SECRET = "internal-s3cret-0123456789"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}"


@pytest.fixture
async def api(aiohttp_client: Any, settings: Settings) -> AsyncIterator[Api]:
    server, api = await start_api(aiohttp_client, settings.with_(internal_secret=SECRET))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def _anonymous(api: Api, path: str) -> tuple[int, Any]:
    resp = await api.client.get(path)
    return resp.status, await resp.text()


async def test_public_paths_need_no_key(api: Api) -> None:
    for path in ("/health", "/metrics", "/docs", "/openapi.json"):
        status, body = await _anonymous(api, path)
        assert status == 200, (path, body)
    # Under /docs/ and outside /api/: never a 401 (what is not there is a 404, not a login prompt).
    for path in ("/docs/no-such-asset.js", "/no-such-page"):
        status, body = await _anonymous(api, path)
        assert status == 404, (path, body)


async def test_every_api_path_needs_a_key(api: Api) -> None:
    for path in ("/api/agents", "/api/sessions", "/api/no-such-route", "/api/internal/api-keys"):
        status, body = await _anonymous(api, path)
        assert status == 401, (path, body)


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Bearer    ", "Basic abc", "abc", "Token x"])
async def test_a_malformed_authorization_header_is_refused_as_such(api: Api, header: str) -> None:
    status, body = await api.call("GET", "/api/agents", headers={"Authorization": header})
    assert status == 401
    assert body == {"error": "Invalid Authorization header format", "statusCode": 401}


async def test_the_scheme_is_case_insensitive_and_the_token_trimmed(api: Api) -> None:
    for header in (f"bearer {api.key}", f"BEARER {api.key}", f"Bearer   {api.key}  "):
        status, body = await api.call("GET", "/api/agents", headers={"Authorization": header})
        assert status == 200, (header, body)


async def test_the_internal_endpoints_take_the_secret_and_nothing_else(api: Api) -> None:
    internal = "/api/internal/api-keys"
    status, body = await api.call("POST", internal, json={"tenantId": "acme"}, key=SECRET)
    assert status == 201 and body["tenantId"] == "acme"
    # A tenant's valid API key is not the secret, nor is a near miss of it.
    for wrong in (api.key, body["key"], SECRET[:-1], SECRET + "x"):
        status, body = await api.call("POST", internal, json={"tenantId": "acme"}, key=wrong)
        assert status == 401 and body == {"error": "Invalid internal secret", "statusCode": 401}
    # And the secret is no API key for the tenant routes.
    status, body = await api.call("GET", "/api/agents", key=SECRET)
    assert status == 401 and body["error"] == "Invalid API key"


async def test_a_key_works_for_its_own_tenant_only(api: Api) -> None:
    acme = await api.new_tenant_key("acme")
    status, body = await api.call("POST", "/api/api-keys", json={"label": "acme-ci"}, key=acme)
    assert status == 201
    status, body = await api.call("GET", "/api/api-keys", key=acme)
    assert status == 200 and sorted(k["label"] for k in body["keys"]) == ["acme-ci", "test"]
    status, body = await api.call("GET", "/api/api-keys")  # tenant default does not see them
    assert status == 200 and [k["label"] for k in body["keys"]] == ["initial key"]


async def test_a_cached_key_is_revoked_at_once_and_an_unknown_key_is_refused_each_time(api: Api) -> None:
    status, minted = await api.call("POST", "/api/api-keys", json={"label": "ci"})
    assert status == 201
    for _ in range(2):  # the second request is answered from the cache
        assert (await api.call("GET", "/api/agents", key=minted["key"]))[0] == 200
    assert (await api.call("DELETE", f"/api/api-keys/{minted['id']}"))[0] == 200
    status, body = await api.call("GET", "/api/agents", key=minted["key"])
    assert status == 401 and body == {"error": "Invalid API key", "statusCode": 401}
    for _ in range(2):  # a refused key is not cached as valid
        status, body = await api.call("GET", "/api/agents", key="ashd_not-a-key-at-all")
        assert status == 401 and body["error"] == "Invalid API key"


async def test_the_rate_limit_refuses_the_request_after_the_burst(
        aiohttp_client: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # The limiter's clock stands still, so the answer does not depend on how fast the requests go:
    # burst 1 at 2 requests/s, the second request waits 0.5 s for its token.
    monkeypatch.setattr(_ratelimit, "time", SimpleNamespace(monotonic=lambda: 5000.0))
    server, api = await start_api(aiohttp_client, settings.with_(rate_limit_rps=2.0, rate_limit_burst=1))
    try:
        assert (await api.call("GET", "/api/agents"))[0] == 200
        resp = await api.client.get("/api/agents", headers=api.headers())
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"  # 0.5 s, rounded up to whole seconds
        body = await resp.json()
        assert body["statusCode"] == 429 and "2 requests/s, burst 1" in body["error"]
        # Another tenant's key has its own bucket.
        acme = await api.new_tenant_key("acme")
        assert (await api.call("GET", "/api/agents", key=acme))[0] == 200
        assert (await api.client.get("/health")).status == 200  # public paths are never limited
    finally:
        await api.client.close()
        await server.stop()


@pytest.mark.parametrize("refusal", ["database or disk is full", "attempt to write a readonly database"])
async def test_a_key_still_works_when_its_last_use_cannot_be_recorded(api: Api, caplog: Any, refusal: str) -> None:
    # The database refuses every write to api_keys, with SQLite's own message for a full disk (which
    # ashd maps to StorageFull, 507) or for another failure: verifying a key only reads it, so
    # requests go on; the failed timestamp is a warning, not a 507 or a 500.
    components = api.server.components
    assert components is not None
    async with components.db.engine.begin() as conn:
        await conn.execute(text("CREATE TRIGGER no_key_writes BEFORE UPDATE ON api_keys "
                                f"BEGIN SELECT RAISE(ABORT, '{refusal}'); END"))
    acme = await api.new_tenant_key("acme")
    status, body = await api.call("GET", "/api/api-keys", key=acme)
    assert status == 200, body
    assert [k["lastUsedAt"] for k in body["keys"]] == [None]
    assert "could not record the API key's last use" in caplog.text
