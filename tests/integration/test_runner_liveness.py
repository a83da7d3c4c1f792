"""Runner liveness on real coordinators: runners register and heartbeat through the internal
endpoints; one goes silent and its sessions are paused (with events) within liveness + sweep time,
the other's are untouched; two coordinators on one PostgreSQL sweeping at once pause each session
exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.app import Server
from ashd.config import Settings
from ashd.storage import Runners, Session, SessionEvent
from ashd.storage._sessions import Sessions
from tests.conftest import Api, start_api
from tests.fixtures.databases import fresh_postgres

SECRET = "internal-secret-for-liveness-tests"
AUTH = {"Authorization": f"Bearer {SECRET}"}
LIVENESS, SWEEP, JITTER = 2.0, 0.3, 0.2
API_KEY = "liveness-test-key-7f3a9c2e1b5d8046aa13"  # shared by servers on one database


def coordinator(settings: Settings, data_dir: Path | None = None) -> Settings:
    return settings.with_(mode="coordinator", internal_secret=SECRET, runner_liveness_seconds=LIVENESS,
                          runner_sweep_seconds=SWEEP, runner_sweep_jitter_seconds=JITTER,
                          **({"data_dir": str(data_dir)} if data_dir else {}))


async def register(api: Api, runner_id: str, port: int = 4200) -> None:
    body = {"runnerId": runner_id, "host": "127.0.0.1", "port": port, "maxSandboxes": 4}
    status, answer = await api.call("POST", "/api/internal/runners/register", json=body, headers=AUTH)
    assert status == 200, answer


async def heartbeat(api: Api, runner_id: str) -> int:
    body = {"runnerId": runner_id, "stats": {"running": 1, "warming": 1, "warm": 0, "waiting": 0}, "activeCount": 1}
    status, _ = await api.call("POST", "/api/internal/runners/heartbeat", json=body, headers=AUTH)
    return status


@contextlib.asynccontextmanager
async def heartbeating(api: Api, runner_id: str, every: float = 0.2) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            assert await heartbeat(api, runner_id) == 200
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled(), "the heartbeat loop failed"  # a 404 would end it early


async def on_runner(repo: Sessions, runner_id: str, status: str = "active", turn_open: bool = False) -> str:
    row = await repo.insert(Session(tenant_id="default", agent_name="a", status=status, runner_id=runner_id,
                                    turn_open=turn_open))
    return row.id


async def lifecycle(server: Server, sid: str) -> list[dict[str, Any]]:
    from sqlalchemy import select

    assert server.components is not None
    async with server.components.db.read() as s:
        rows = (await s.execute(select(SessionEvent).where(SessionEvent.session_id == sid)
                                .order_by(SessionEvent.sequence))).scalars().all()
    return [{"type": r.type, "data": json.loads(r.data) if r.data else None, "frame": r.frame_event} for r in rows]


async def status_of(repo: Sessions, sid: str) -> str:
    return (await repo.get("default", sid)).status


async def test_silent_runner_sessions_paused(aiohttp_client: Any, settings: Settings) -> None:
    server, api = await start_api(aiohttp_client, coordinator(settings))
    try:
        assert server.components is not None
        repo = Sessions(server.components.db)
        await register(api, "r-quiet")
        await register(api, "r-alive")
        status, health = await api.call("GET", "/health")
        assert health["remoteRunners"] == 2 and health["coordinatorId"]
        quiet = [await on_runner(repo, "r-quiet"), await on_runner(repo, "r-quiet", "starting"),
                 await on_runner(repo, "r-quiet", turn_open=True)]
        quiet_ended = await on_runner(repo, "r-quiet", "ended")
        alive = [await on_runner(repo, "r-alive"), await on_runner(repo, "r-alive", "starting")]
        async with heartbeating(api, "r-alive"):
            # r-quiet's last heartbeat was its registration: it must be paused within
            # liveness + sweep + jitter (and some slack for a loaded machine), not before liveness.
            started = time.monotonic()
            while await status_of(repo, quiet[0]) == "active":
                assert time.monotonic() - started < LIVENESS + SWEEP + JITTER + 3, "the silent runner was never swept"
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            for sid in quiet:
                assert await status_of(repo, sid) == "paused"
            assert await status_of(repo, quiet_ended) == "ended"
            await asyncio.sleep(3 * (SWEEP + JITTER))  # heartbeating: several sweeps later, still as they were
            assert [await status_of(repo, sid) for sid in alive] == ["active", "starting"]
            status, health = await api.call("GET", "/health")
            assert health["remoteRunners"] == 1
            metrics = (await (await api.client.get("/metrics")).text())
            assert 'ash_runners{state="alive"} 1.0' in metrics and 'ash_runners{state="dead"} 1.0' in metrics
            assert 'ash_runner_max_sandboxes{runner="r-alive"} 4.0' in metrics
            assert 'ash_runner_running_sandboxes{runner="r-alive"} 1.0' in metrics
            assert 'runner="r-quiet"' not in metrics
            assert "ash_runner_lost_sessions_paused_total 3.0" in metrics
            assert "ash_runners_lost_total 1.0" in metrics
            _, listed = await api.call("GET", "/api/internal/runners", headers=AUTH)
            by_id = {r["runnerId"]: r for r in listed["runners"]}
            assert by_id["r-quiet"]["alive"] is False and "deadAt" in by_id["r-quiet"]
            assert by_id["r-alive"]["alive"] is True

        print(f"silent runner's sessions paused within {took:.2f}s of its last heartbeat"
              f" (liveness {LIVENESS}s, sweep {SWEEP}s + jitter {JITTER}s)")
        for sid in quiet:
            events = await lifecycle(server, sid)
            paused = [e for e in events if e["type"] == "lifecycle" and e["data"]["action"] == "paused"]
            assert len(paused) == 1 and paused[0]["data"] == {"action": "paused", "status": "paused",
                                                              "reason": "runner_lost"}
        cut = await lifecycle(server, quiet[2])  # the turn left open is stored as interrupted, then done
        assert [e["frame"] for e in cut] == ["error", "done", None]
        assert "runner stopped answering" in cut[0]["data"]["error"]
        # The dead runner's heartbeat is 404: it registers again, and its sessions stay paused.
        assert await heartbeat(api, "r-quiet") == 404
        await register(api, "r-quiet")
        assert await heartbeat(api, "r-quiet") == 200
        for sid in quiet:
            assert await status_of(repo, sid) == "paused"
        status, health = await api.call("GET", "/health")
        assert health["remoteRunners"] == 2
    finally:
        await api.client.close()
        await server.stop()


async def test_standalone_health_has_no_runner_count(api: Api) -> None:
    status, health = await api.call("GET", "/health")
    assert status == 200 and "remoteRunners" not in health


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async for url in fresh_postgres():
        yield url


async def test_two_coordinators_pause_each_session_once(aiohttp_client: Any, pg_url: str, short_tmp: Path) -> None:
    shared = Settings(database_url=pg_url, api_key=API_KEY, prewarm=0, zygote=False, anthropic_base_url=None,
                      rate_limit_rps=1000.0, rate_limit_burst=1000, actor_timeout_seconds=30.0)
    one, api_one = await start_api(aiohttp_client, coordinator(shared, short_tmp / "c1"))
    two, api_two = await start_api(aiohttp_client, coordinator(shared, short_tmp / "c2"))
    try:
        assert one.components is not None and two.components is not None
        repo = Sessions(one.components.db)
        runners = [f"r{i}" for i in range(6)]
        sessions: dict[str, list[str]] = {}
        for i, runner_id in enumerate(runners):
            await register(api_one if i % 2 else api_two, runner_id)
            sessions[runner_id] = [await on_runner(repo, runner_id, turn_open=(j == 0)) for j in range(5)]
        # Both coordinators' own sweeps run every 0.3-0.5 s; on top, both sweep at the same instant,
        # many times, while the runners go silent: every runner must be won exactly once.
        deadline = time.monotonic() + LIVENESS + 1.5
        won: list[str] = []
        while time.monotonic() < deadline:
            results = await asyncio.gather(Runners(one.components.db).sweep_dead(LIVENESS),
                                           Runners(two.components.db).sweep_dead(LIVENESS))
            won += [r.runner_id for result in results for r in result]
            await asyncio.sleep(0.01)
        for runner_id, sids in sessions.items():
            for sid in sids:
                assert await status_of(repo, sid) == "paused"
                events = await lifecycle(one, sid)
                paused = [e for e in events if e["type"] == "lifecycle"]
                assert len(paused) == 1, (runner_id, events)
                frames = [e["frame"] for e in events if e["frame"]]
                assert frames == (["error", "done"] if sid == sids[0] else [])
        # Each runner was won once: by one of the explicit sweeps or by a coordinator's own loop.
        assert len(won) == len(set(won))
        swept_by_loops = int(_counter(await _metrics(api_one), "ash_runners_lost_total")
                             + _counter(await _metrics(api_two), "ash_runners_lost_total"))
        assert len(won) + swept_by_loops == len(runners)
        print(f"{len(won)} runners won by the simultaneous sweeps, {swept_by_loops} by the coordinators' loops")
    finally:
        for api, server in ((api_one, one), (api_two, two)):
            await api.client.close()
            await server.stop()


async def _metrics(api: Api) -> str:
    return await (await api.client.get("/metrics")).text()


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")
