"""Credentials API through real HTTP: secrets never returned, encrypted at rest, tenant scoped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from ashd.config import Settings
from ashd.errors import NotFound
from ashd.storage import Credential
from tests.conftest import Api, start_api

SECRET = "sk-ant-test-0123456789abcdefSECRET"


async def raw_ciphertexts(api: Api) -> list[bytes]:
    services = api.server.components
    assert services is not None
    async with services.db.read() as s:
        return list((await s.execute(select(Credential.secret_ciphertext))).scalars().all())


async def test_create_list_get_delete_never_returns_key(api: Api) -> None:
    status, body = await api.call("POST", "/api/credentials", json={"type": "anthropic", "key": SECRET,
                                                                     "label": "main"})
    assert status == 201, body
    cred = body["credential"]
    assert cred["type"] == "anthropic"
    assert cred["label"] == "main"
    assert cred["tenantId"] == "default"
    assert cred["lastUsedAt"] is None
    assert cred["createdAt"].endswith("Z")
    assert SECRET not in json.dumps(body)
    assert "key" not in cred

    status, body = await api.call("GET", "/api/credentials")
    assert status == 200
    assert [c["id"] for c in body["credentials"]] == [cred["id"]]
    assert SECRET not in json.dumps(body)
    status, body = await api.call("GET", f"/api/credentials/{cred['id']}")
    assert status == 200
    assert body["credential"] == cred

    resp = await api.client.delete(f"/api/credentials/{cred['id']}", headers=api.headers())
    assert resp.status == 204
    assert await resp.read() == b""
    status, body = await api.call("GET", f"/api/credentials/{cred['id']}")
    assert status == 404
    assert body == {"error": f"Credential {cred['id']} not found", "statusCode": 404}
    status, body = await api.call("DELETE", f"/api/credentials/{cred['id']}")
    assert status == 404
    assert body["statusCode"] == 404


async def test_encrypted_at_rest(api: Api) -> None:
    await api.call("POST", "/api/credentials", json={"type": "openai", "key": SECRET})
    bedrock = {"accessKeyId": "AKIAEXAMPLEKEYID", "secretAccessKey": "wJalrXUtnFEMI/K7MDENG",
               "region": "eu-west-1"}
    await api.call("POST", "/api/credentials", json={"type": "bedrock", "key": bedrock})
    blobs = await raw_ciphertexts(api)
    assert len(blobs) == 2
    for blob in blobs:
        for needle in (SECRET.encode(), b"AKIAEXAMPLEKEYID", b"wJalrXUtnFEMI", b"eu-west-1"):
            assert needle not in blob


async def test_use_credential_env_and_last_used(api: Api) -> None:
    services = api.server.components
    assert services is not None
    expected: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"type": "anthropic", "key": SECRET}, {"ANTHROPIC_API_KEY": SECRET}),
        ({"type": "openai", "key": "sk-openai"}, {"OPENAI_API_KEY": "sk-openai"}),
        ({"type": "custom", "key": "c-123"}, {"SERVICE_CUSTOM_API_KEY": "c-123"}),
        ({"type": "bedrock", "key": json.dumps({"accessKeyId": "AK", "secretAccessKey": "SK",
                                                "region": "us-east-1", "sessionToken": "TOK"})},
         {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "us-east-1",
          "AWS_SESSION_TOKEN": "TOK"}),
        ({"type": "bedrock", "key": {"accessKeyId": "AK", "secretAccessKey": "SK", "region": "us-east-1"}},
         {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "us-east-1"}),
    ]
    for payload, env in expected:
        status, body = await api.call("POST", "/api/credentials", json=payload)
        assert status == 201, body
        cred_id = body["credential"]["id"]
        resolved = await services.credentials.use("default", cred_id)
        assert resolved.type == payload["type"]
        assert dict(resolved.env) == env
        assert "SK" not in repr(resolved)
        assert SECRET not in repr(resolved)
        _, got = await api.call("GET", f"/api/credentials/{cred_id}")
        assert got["credential"]["lastUsedAt"] is not None
    with pytest.raises(NotFound, match="Credential nope not found"):
        await services.credentials.use("default", "nope")


async def test_validation_errors(api: Api) -> None:
    cases: list[tuple[Any, str]] = [
        ({"type": "azure", "key": "k"}, "`type` must be one of anthropic, openai, bedrock, custom"),
        ({"key": "k"}, "`type` must be one of"),
        ({"type": "openai"}, "`key` is required"),
        ({"type": "openai", "key": ""}, "`key` is required"),
        ({"type": "openai", "key": 5}, "`key` is required"),
        ({"type": "openai", "key": "a\nb"}, "control characters"),
        ({"type": "bedrock", "key": "not json"}, "not valid JSON"),
        ({"type": "bedrock", "key": {"accessKeyId": "A", "region": "r"}}, "secretAccessKey"),
        ({"type": "bedrock", "key": {"accessKeyId": "A", "secretAccessKey": "S", "region": "r", "x": 1}},
         "unknown: x"),
        ({"type": "bedrock", "key": ["A"]}, "must be an object"),
        ({"type": "openai", "key": "k", "label": 3}, "`label` must be a string"),
    ]
    for payload, fragment in cases:
        status, body = await api.call("POST", "/api/credentials", json=payload)
        assert (status, body["statusCode"]) == (400, 400), (payload, body)
        assert fragment in body["error"], (payload, body)
    assert await raw_ciphertexts(api) == []


async def test_another_tenant_sees_404(api: Api) -> None:
    services = api.server.components
    assert services is not None
    _, body = await api.call("POST", "/api/credentials", json={"type": "custom", "key": "mine"})
    cred_id = body["credential"]["id"]
    other = await api.new_tenant_key("acme")
    status, body = await api.call("GET", f"/api/credentials/{cred_id}", key=other)
    assert status == 404
    assert body["statusCode"] == 404
    status, body = await api.call("DELETE", f"/api/credentials/{cred_id}", key=other)
    assert status == 404
    status, body = await api.call("GET", "/api/credentials", key=other)
    assert body == {"credentials": []}
    with pytest.raises(NotFound):
        await services.credentials.use("acme", cred_id)
    status, _ = await api.call("GET", f"/api/credentials/{cred_id}")
    assert status == 200


async def test_ciphertext_is_bound_to_its_row(api: Api) -> None:
    """A ciphertext copied onto another row (or tenant) does not decrypt."""
    services = api.server.components
    assert services is not None
    _, a = await api.call("POST", "/api/credentials", json={"type": "custom", "key": "aaa"})
    _, b = await api.call("POST", "/api/credentials", json={"type": "custom", "key": "bbb"})
    async with services.db.tx() as s:
        by_id = select(Credential).where
        row_a = (await s.execute(by_id(Credential.id == a["credential"]["id"]))).scalar_one()
        row_b = (await s.execute(by_id(Credential.id == b["credential"]["id"]))).scalar_one()
        row_b.secret_ciphertext = row_a.secret_ciphertext
    from cryptography.exceptions import InvalidTag

    with pytest.raises(InvalidTag):
        await services.credentials.use("default", b["credential"]["id"])


async def test_restart_keeps_agents_and_credentials(aiohttp_client: Any, settings: Settings,
                                                    tmp_path: Path) -> None:
    server, api = await start_api(aiohttp_client, settings)
    try:
        _, body = await api.call("POST", "/api/credentials", json={"type": "anthropic", "key": SECRET})
        cred_id = body["credential"]["id"]
        status, body = await api.call("POST", "/api/agents", json={"name": "keep", "systemPrompt": "persist",
                                                                   "env": {"TOKEN": "t0k"}})
        assert status == 201, body
    finally:
        await api.client.close()
        await server.stop()

    server, api = await start_api(aiohttp_client, settings)
    try:
        status, body = await api.call("GET", f"/api/credentials/{cred_id}")
        assert status == 200
        assert body["credential"]["type"] == "anthropic"
        assert server.components is not None
        resolved = await server.components.credentials.use("default", cred_id)
        assert resolved.secret == SECRET  # the generated credential key was reloaded from the data dir
        status, body = await api.call("GET", "/api/agents/keep")
        assert status == 200
        assert body["agent"]["env"] == {"TOKEN": "***"}
        status, body = await api.call("GET", "/api/agents/keep/files/AGENT.md")
        assert status == 200
        assert body["content"] == "persist"
    finally:
        await api.client.close()
        await server.stop()
