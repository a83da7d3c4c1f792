"""The pool seen through a real server: /health stats, pre-warmed claims that keep the session's
configuration, eviction with snapshot, capacity 503, the idle sweep and tenant separation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, send

pytestmark = pytest.mark.sandbox
Starter = Callable[..., Awaitable[Api]]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the pool does not touch the database; the session suites cover PostgreSQL."""
    return f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}"


@pytest.fixture
async def start(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Starter]:  # noqa: F811
    started: list[tuple[Any, Api]] = []

    async def go(**changes: Any) -> Api:
        server, api = await start_api(aiohttp_client, settings.with_(
            zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test", **changes))
        started.append((server, api))
        await deploy(api)
        return api

    yield go
    for server, api in started:
        await api.client.close()
        await server.stop()


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll a condition through the API until it holds (no fixed sleeps), or fail."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def pool(api: Api) -> dict[str, int]:
    status, body = await api.call("GET", "/health")
    assert status == 200
    stats: dict[str, int] = body["pool"]
    states = ("cold", "warming", "warm", "waiting", "running")
    assert stats["total"] == sum(stats[s] for s in states)
    assert body["activeSandboxes"] == stats["total"] - stats["cold"]
    return stats


async def wait_pool(api: Api, **expected: int) -> None:
    async def check() -> bool:
        stats = await pool(api)
        return all(stats[k] == v for k, v in expected.items())

    await eventually(check, f"pool {expected}")


async def status_of(api: Api, sid: str) -> str:
    code, body = await api.call("GET", f"/api/sessions/{sid}")
    assert code == 200, body
    return str(body["session"]["status"])


async def read_file(api: Api, sid: str, path: str) -> str:
    code, body = await api.call("GET", f"/api/sessions/{sid}/files/{path}", params={"format": "json"})
    assert code == 200, body
    return str(body["content"])


async def lifecycle(api: Api, sid: str) -> list[dict[str, Any]]:
    code, body = await api.call("GET", f"/api/sessions/{sid}/events", params={"limit": "1000"})
    assert code == 200
    events = list(body["events"])
    for event in events:  # the stored payload is JSON text
        if isinstance(event["data"], str):
            event["data"] = json.loads(event["data"])
    return events


async def test_prewarmed_claim_keeps_session_configuration(start: Starter, fake_model: FakeModel) -> None:  # noqa: F811
    api = await start(prewarm=1)
    await wait_pool(api, warm=1)
    fake_model.script("tok-env", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo $MY_VAR > out.txt"}}]},
        {"content": [{"type": "text", "text": "written"}]},
    ])
    session = await create(
        api, extraEnv={"MY_VAR": "value-from-session"}, systemPrompt="You are the tok-env tester.",
        mcpServers={"echo": {"command": "python3", "args": ["-c", "pass"]}})
    sid = session["id"]
    stats = await pool(api)
    assert stats["preWarmHits"] == 1 and stats["waiting"] == 1
    await wait_pool(api, warm=1, waiting=1)  # refilled

    status, frames = await send(api, sid, "tok-env please")
    assert status == 200 and frames[-1].event == "done"
    assert not [f for f in frames if f.event == "error"]
    assert (await read_file(api, sid, "out.txt")).strip() == "value-from-session"
    requests = fake_model.requests_containing("tok-env please")
    assert requests
    system = requests[0]["body"].get("system")
    assert "You are the tok-env tester." in json.dumps(system)
    mcp = json.loads(await read_file(api, sid, ".mcp.json"))
    assert mcp["mcpServers"]["echo"]["command"] == "python3"
    await wait_pool(api, waiting=1, running=0)


async def test_transitions_visible_in_health(start: Starter, fake_model: FakeModel) -> None:  # noqa: F811
    api = await start(prewarm=0)
    assert (await pool(api))["total"] == 0
    fake_model.script("tok-slow", [{"content": [{"type": "text", "text": "a slow answer " * 20}], "delay": 0.05}])
    sid = (await create(api))["id"]
    # A sandbox launched for its session turns from warming to waiting when the pool takes the
    # session's word that it is configured: a message the create does not wait for.
    await wait_pool(api, waiting=1, warming=0, preWarmHits=0)
    turn = asyncio.create_task(send(api, sid, "tok-slow go"))
    await wait_pool(api, running=1, waiting=0)
    status, frames = await turn
    assert status == 200 and frames[-1].event == "done"
    await wait_pool(api, running=0, waiting=1)
    code, _ = await api.call("DELETE", f"/api/sessions/{sid}")
    assert code == 200
    await wait_pool(api, total=0)


async def test_eviction_pauses_with_snapshot_then_503(start: Starter, fake_model: FakeModel) -> None:  # noqa: F811
    api = await start(prewarm=0, max_sandboxes=1)
    fake_model.script("tok-file", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo kept > notes.txt"}}]},
        {"content": [{"type": "text", "text": "ok"}]},
    ])
    first = (await create(api))["id"]
    status, frames = await send(api, first, "tok-file write")
    assert status == 200 and frames[-1].event == "done"
    second = (await create(api))["id"]  # capacity 1: the waiting first session is evicted

    async def first_paused() -> bool:
        return await status_of(api, first) == "paused"

    await eventually(first_paused, "evicted session paused")
    assert (await read_file(api, first, "notes.txt")).strip() == "kept"  # from the snapshot
    paused = [e for e in await lifecycle(api, first)
              if e["type"] == "lifecycle" and e["data"].get("action") == "paused"]
    assert paused and paused[-1]["data"].get("reason") == "evicted"

    # With the only sandbox mid-turn, nothing can be evicted: 503 ApiError.
    fake_model.script("tok-long", [{"content": [{"type": "text", "text": "x" * 400}], "delay": 0.05}])
    turn = asyncio.create_task(send(api, second, "tok-long go"))
    await wait_pool(api, running=1)
    code, body = await api.call("POST", "/api/sessions", json={"agent": "helper"})
    assert code == 503 and body["statusCode"] == 503 and "capacity" in body["error"].lower()
    code, body = await api.call("POST", f"/api/sessions/{first}/resume")
    assert code == 503 and body["statusCode"] == 503
    status, frames = await turn
    assert status == 200 and frames[-1].event == "done"
    assert not [f for f in frames if f.event == "error"]
    # The turn is over: the first session can come back (evicting the second), files intact.
    code, body = await api.call("POST", f"/api/sessions/{first}/resume")
    assert code == 200 and body["session"]["status"] == "active"
    assert (await read_file(api, first, "notes.txt")).strip() == "kept"


async def test_idle_sweep_pauses_but_never_during_a_turn(start: Starter, fake_model: FakeModel) -> None:  # noqa: F811
    api = await start(prewarm=0, idle_timeout_seconds=1)
    # The tool call alone outlasts the idle timeout.
    fake_model.script("tok-busy", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "sleep 2.5; echo slept > s.txt"}}]},
        {"content": [{"type": "text", "text": "done sleeping"}]},
    ])
    sid = (await create(api))["id"]
    status, frames = await send(api, sid, "tok-busy go")
    assert status == 200 and frames[-1].event == "done"
    assert not [f for f in frames if f.event == "error"]
    assert frames[-2].data.get("type") == "result"

    async def paused() -> bool:
        return await status_of(api, sid) == "paused"

    await eventually(paused, "idle session paused")
    events = await lifecycle(api, sid)
    kinds = [(e["type"], e["data"].get("action"), e["data"].get("reason")) for e in events]
    done_at = max(i for i, k in enumerate(kinds) if k[0] == "turn_complete")
    pauses = [i for i, k in enumerate(kinds) if k[1] == "paused"]
    assert pauses and min(pauses) > done_at, kinds  # not swept during the turn
    assert kinds[pauses[0]][2] == "idle"
    assert (await read_file(api, sid, "s.txt")).strip() == "slept"  # from the snapshot
    await wait_pool(api, total=0)


async def test_tenants_never_share_a_sandbox(start: Starter) -> None:
    api = await start(prewarm=1)
    other = await api.new_tenant_key("tenant-b")
    await wait_pool(api, warm=1)
    # Tenant A holds sandboxes while B claims (one live, one paused: both keep theirs), and has
    # ended a session: none of them may reach tenant B.
    used_by_a: set[str] = set()
    kept: list[dict[str, Any]] = []
    for action in ("keep", "pause", "delete"):
        await wait_pool(api, warm=1)  # every claim below is a pre-warm hit
        session = await create(api)
        used_by_a.add(session["sandboxId"])
        if action == "keep":
            kept.append(session)
        else:
            code, _ = await api.call("POST" if action == "pause" else "DELETE",
                                     f"/api/sessions/{session['id']}" + ("/pause" if action == "pause" else ""))
            assert code == 200
            if action == "pause":
                kept.append(session)
    await wait_pool(api, warm=1, waiting=2)
    for _ in range(2):
        await wait_pool(api, warm=1)
        code, body = await api.call("POST", "/api/sessions", key=other, json={"agent": "helper"})
        if code == 404:  # agents are per tenant: deploy for tenant B once
            code, _ = await api.call("POST", "/api/agents", key=other,
                                     json={"name": "helper", "systemPrompt": "B"})
            assert code == 201
            code, body = await api.call("POST", "/api/sessions", key=other, json={"agent": "helper"})
        assert code == 201, body
        assert body["session"]["sandboxId"] not in used_by_a
    stats = await pool(api)
    assert stats["preWarmHits"] == 5 and stats["waiting"] == 4
    for session in kept:  # A's sandboxes are still A's
        code, body = await api.call("GET", f"/api/sessions/{session['id']}")
        assert code == 200 and body["session"]["sandboxId"] == session["sandboxId"]
