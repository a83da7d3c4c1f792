# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""ModelProxy on a Unix socket in front of the fake model: key swap, allowlist, streaming, stats."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing._model_proxy import ModelProxy
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401


@pytest.fixture
async def proxied(fake_model: FakeModel) -> AsyncIterator[tuple[ModelProxy, httpx2.AsyncClient]]:
    run = Path(tempfile.mkdtemp(prefix="ashd-mp-", dir="/tmp"))
    proxy = ModelProxy(fake_model.url)
    await proxy.start_for("sb1", run / "model.sock")
    client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(run / "model.sock")))
    try:
        yield proxy, client
    finally:
        await client.aclose()
        await proxy.close()
        shutil.rmtree(run, ignore_errors=True)


BODY = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "PROXY-1 hi"}]}


async def test_key_is_replaced_and_stream_passes_through(
    proxied: tuple[ModelProxy, httpx2.AsyncClient], fake_model: FakeModel
) -> None:
    proxy, client = proxied
    keys = iter(["sk-first", "sk-second"])
    proxy.set_key_provider("sb1", lambda: next(keys))
    headers = {
        "x-api-key": "sandbox-no-key",
        "authorization": "Bearer leaked",
        "anthropic-version": "2023-06-01",
    }
    streamed = json.dumps(BODY | {"stream": True}).encode()
    plain = json.dumps(BODY).encode()
    headers["content-type"] = "application/json"
    resp = await client.post("http://model-proxy/v1/messages", content=streamed, headers=headers)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert "event: message_stop" in resp.text
    resp = await client.post("http://model-proxy/v1/messages", content=plain, headers=headers)
    assert resp.json()["content"][0]["text"] == "echo: PROXY-1 hi"
    seen = fake_model.requests_containing("PROXY-1")
    assert [r["headers"]["x-api-key"] for r in seen] == ["sk-first", "sk-second"]
    assert all("authorization" not in r["headers"] for r in seen)
    assert seen[0]["headers"]["anthropic-version"] == "2023-06-01"
    stats = proxy.stats("sb1")
    assert stats.requests == 2
    assert stats.bytes_in == len(streamed) + len(plain)
    assert stats.bytes_out > 0


async def test_only_messages_endpoints_are_forwarded(proxied: tuple[ModelProxy, httpx2.AsyncClient]) -> None:
    proxy, client = proxied
    proxy.set_key_provider("sb1", lambda: "sk-x")
    resp = await client.get("http://model-proxy/v1/models")
    assert resp.status_code == 404
    assert resp.json()["type"] == "error"
    count = await client.post("http://model-proxy/v1/messages/count_tokens", json=BODY)
    assert count.status_code == 200
    assert count.json()["input_tokens"] > 0


async def test_no_key_is_an_anthropic_shaped_401(proxied: tuple[ModelProxy, httpx2.AsyncClient]) -> None:
    _, client = proxied
    resp = await client.post("http://model-proxy/v1/messages", json=BODY)
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"


async def test_async_key_provider(proxied: tuple[ModelProxy, httpx2.AsyncClient], fake_model: FakeModel) -> None:
    proxy, client = proxied

    async def provider() -> str:
        return "sk-async"

    proxy.set_key_provider("sb1", provider)
    resp = await client.post("http://model-proxy/v1/messages", json=BODY)
    assert resp.status_code == 200
    assert fake_model.requests_containing("PROXY-1")[-1]["headers"]["x-api-key"] == "sk-async"
