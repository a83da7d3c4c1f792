"""The message stream through real HTTP: partial messages, model precedence, backpressure with a
stalled reader, the client read timeout, and replay after a dropped connection."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from ashd.http import _sse
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames
from tests.integration.test_sessions import create, deploy, send

pytestmark = pytest.mark.sandbox


@pytest.fixture
async def tapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    """Like `sapi`, with SERVICE_DEBUG_TIMING on."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-test", debug_timing=True))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def _turn_completed(api: Api, sid: str) -> bool:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=turn_complete")
    return bool(body["events"])


async def test_partials_precedence_and_timing(tapi: Api, fake_model: FakeModel,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    status, body = await tapi.call("POST", "/api/agents", json={
        "name": "helper", "systemPrompt": "You are helpful.",
        "files": [{"path": ".agent/settings.json", "content": json.dumps({"model": "m-settings"})}]})
    assert status == 201, body
    await deploy(tapi, "plain")

    # includePartialMessages: stream_event text deltas arrive, and are not stored as messages
    fake_model.script("partial-tok", [{"content": [{"type": "text", "text": "streamed in pieces"}], "chunk": 3}])
    sid = (await create(tapi))["id"]
    status, frames = await send(tapi, sid, "partial-tok", includePartialMessages=True)
    assert status == 200
    deltas = [f.data["event"]["delta"]["text"] for f in frames if f.event == "message"
              and f.data["type"] == "stream_event" and f.data["event"]["type"] == "content_block_delta"
              and f.data["event"]["delta"]["type"] == "text_delta"]
    assert "".join(deltas) == "streamed in pieces" and len(deltas) > 1
    status, body = await tapi.call("GET", f"/api/sessions/{sid}/messages")
    assert all(json.loads(m["content"]).get("type") != "stream_event" for m in body["messages"])

    def model_of(token: str) -> str:
        return str(fake_model.requests_containing(token)[-1]["body"]["model"])

    # model precedence: message > session > agent record > .agent/settings.json > default
    assert model_of("partial-tok") == "m-settings"
    await send(tapi, sid, "tok-message", model="m-message")
    assert model_of("tok-message") == "m-message"
    status, body = await tapi.call("PATCH", "/api/agents/helper", json={"model": "m-agent"})
    assert status == 200, body
    sid2 = (await create(tapi))["id"]
    await send(tapi, sid2, "tok-agent")
    assert model_of("tok-agent") == "m-agent"
    sid3 = (await create(tapi, model="m-session"))["id"]
    await send(tapi, sid3, "tok-session")
    assert model_of("tok-session") == "m-session"
    await send(tapi, sid3, "tok-session-message", model="m-message2")
    assert model_of("tok-session-message") == "m-message2"
    status, body = await tapi.call("POST", "/api/sessions", json={"agent": "plain"})
    await send(tapi, body["session"]["id"], "tok-default")
    assert model_of("tok-default") == "claude-sonnet-4-5"

    # SERVICE_DEBUG_TIMING=1: one timing line per message
    timings = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"timing"' in line]
    mine = [t for t in timings if t.get("sessionId") == sid]
    assert len(mine) == 2
    for t in mine:
        assert {"type", "source", "sessionId", "sandboxId", "lookupMs", "firstEventMs", "totalMs", "eventCount",
                "timestamp"} <= set(t) and t["eventCount"] > 0


async def _raw_post(api: Api, sid: str, body: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw HTTP client with a tiny receive buffer, so a stalled reader really holds the stream."""
    server = api.client.server
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (str(server.host), int(server.port or 0)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    payload = json.dumps(body).encode()
    writer.write((f"POST /api/sessions/{sid}/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {api.key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


async def test_backpressure_timeout_and_replay(tapi: Api, fake_model: FakeModel,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    await deploy(tapi)
    pieces = 20_000
    fake_model.script("long-stream", [{"content": [{"type": "text", "text": "y" * pieces}], "chunk": 1}])

    # a reader that stops: the bridge is paused, the turn does not run ahead of the client
    sid = (await create(tapi))["id"]
    reader, writer = await _raw_post(tapi, sid, {"content": "long-stream", "includePartialMessages": True})
    await _wait_for(lambda: _has_request(fake_model, "long-stream"))
    for _ in range(20):  # a bounded look while the client holds still: nothing completes
        assert not await _turn_completed(tapi, sid)
        await asyncio.sleep(0.05)
    async with asyncio.timeout(60):
        rest = await reader.read(-1)  # resume reading: every frame arrives, then done
    writer.close()
    frames = parse_frames(_dechunk(rest))
    deltas = [f for f in frames if f.event == "message" and f.data["type"] == "stream_event"
              and f.data["event"]["type"] == "content_block_delta"]
    assert len(deltas) == pieces and frames[-1].event == "done"
    assert await _turn_completed(tapi, sid)

    # a reader that stops for longer than the read timeout is disconnected; the turn is stored anyway
    monkeypatch.setattr(_sse, "CLIENT_READ_TIMEOUT", 0.5)
    sid = (await create(tapi))["id"]
    reader, writer = await _raw_post(tapi, sid, {"content": "long-stream again", "includePartialMessages": True})
    await _wait_for(lambda: _turn_completed(tapi, sid), timeout=60)
    async with asyncio.timeout(30):
        tail = await reader.read(-1)  # the server closed the connection: EOF, not the whole turn
    writer.close()
    assert b"event: done" not in tail
    status, body = await tapi.call("GET", f"/api/sessions/{sid}/messages")
    assert [m["role"] for m in body["messages"]][0] == "user" and len(body["messages"]) >= 3
    monkeypatch.setattr(_sse, "CLIENT_READ_TIMEOUT", 30.0)

    # replay: drop the connection after the first frame, reconnect with Last-Event-ID
    fake_model.script("replay-tok", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo one"}}]},
        {"content": [{"type": "text", "text": "z" * 150}], "chunk": 1, "delay": 0.01},
    ])
    sid = (await create(tapi))["id"]
    resp = await tapi.client.post(f"/api/sessions/{sid}/messages", json={"content": "replay-tok"},
                                  headers=tapi.headers())
    first = b""
    while not first.endswith(b"\r\n\r\n") and not first.endswith(b"\n\n"):
        first += await resp.content.readline()
    [head] = parse_frames(first.decode())
    assert head.event == "message" and head.id is not None
    resp.close()  # the connection drops mid-turn
    resp = await tapi.client.get(f"/api/sessions/{sid}/stream",
                                 headers={**tapi.headers(), "Last-Event-ID": str(head.id)})
    assert resp.status == 200
    async with asyncio.timeout(60):
        replayed = parse_frames(await resp.text())
    ids = [f.id or 0 for f in replayed]
    assert ids == sorted(set(ids)) and ids[0] > (head.id or 0)  # each missed frame once, in order
    assert replayed[-1].event == "done" and [f.event for f in replayed].count("done") == 1
    assert any(f.event == "message" and f.data["type"] == "result" for f in replayed), [(f.event, f.id, str(f.data)[:300]) for f in replayed]
    resp = await tapi.client.get(f"/api/sessions/{sid}/stream?after=0", headers=tapi.headers())
    everything = parse_frames(await resp.text())
    assert [f.id for f in everything] == [head.id, *ids]


async def _has_request(fake_model: FakeModel, token: str) -> bool:  # noqa: F811
    return bool(fake_model.requests_containing(token))


def _dechunk(raw: bytes) -> str:
    """Undo HTTP/1.1 chunked transfer coding of a raw response body."""
    out, pos = bytearray(), 0
    while pos < len(raw):
        end = raw.find(b"\r\n", pos)
        if end < 0:
            break
        size = int(raw[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += raw[end + 2:end + 2 + size]
        pos = end + 2 + size + 2
    return out.decode()
