"""Coordinator mode on PostgreSQL with real `ashd runner` processes: routing by capacity, every
session call through the coordinator to its runner, 503 without runners, the local fallback, the
runner API's secret, a replay through a second coordinator, registration retries and SIGTERM.

Coordinators are in-process apps (real sockets, real HTTP clients); runners are separate processes
that register with them over HTTP. The fake model server is the only stand-in."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ashd.app import Server
from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.e2e.test_serve_process import free_port
from tests.fixtures.databases import fresh_postgres
from tests.fixtures.sse import parse_frames

pytestmark = pytest.mark.sandbox
SECRET = "runner-test-secret-" + secrets.token_hex(8)
CREDENTIAL_KEY = secrets.token_hex(32)
API_KEY = "runner-test-api-key-" + secrets.token_hex(16)


@pytest.fixture
async def pg() -> AsyncIterator[str]:
    async for url in fresh_postgres():
        yield url


@pytest.fixture
def agent_dir(short_tmp: Path) -> Path:
    """A path agent: both processes read the same folder (agent folders deployed with `files` live
    on one process's disk until they are stored in the database)."""
    path = short_tmp / "agent"
    path.mkdir()
    (path / "AGENT.md").write_text("You are a test agent.\n")
    (path / "notes.txt").write_text("from the agent folder\n")
    return path


@dataclass
class RunnerProc:
    runner_id: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Cluster:
    tmp: Path
    pg: str
    fake: FakeModel
    runners: list[RunnerProc] = field(default_factory=list)

    def start_runner(self, runner_id: str, server_url: str, *, max_sandboxes: int = 4,
                     env: dict[str, str] | None = None) -> RunnerProc:
        port = free_port()
        data = self.tmp / f"rd-{runner_id}"
        full = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        full.update({
            "SERVICE_DATA_DIR": str(data), "SERVICE_HOST": "127.0.0.1", "SERVICE_RUNNER_PORT": str(port),
            "SERVICE_RUNNER_ID": runner_id, "SERVICE_RUNNER_ADVERTISE_HOST": "127.0.0.1",
            "SERVICE_SERVER_URL": server_url, "SERVICE_INTERNAL_SECRET": SECRET,
            "SERVICE_CREDENTIAL_KEY": CREDENTIAL_KEY, "SERVICE_DATABASE_URL": self.pg,
            "SERVICE_PREWARM": "0", "SERVICE_ZYGOTE": "0", "SERVICE_MAX_SANDBOXES": str(max_sandboxes),
            "SERVICE_RUNNER_HEARTBEAT_SECONDS": "0.5", "SERVICE_SHUTDOWN_GRACE_SECONDS": "5",
            "ANTHROPIC_BASE_URL": self.fake.url, "ANTHROPIC_API_KEY": "sk-ant-runner", **(env or {}),
        })
        log = self.tmp / f"runner-{runner_id}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ashd", "runner"], env=full, stderr=out,
                                    stdout=subprocess.DEVNULL)
        runner = RunnerProc(runner_id, port, proc, log)
        self.runners.append(runner)
        _STARTED[runner_id] = runner
        return runner

    def stop_all(self) -> None:
        for runner in self.runners:
            if runner.proc.poll() is None:
                runner.proc.send_signal(signal.SIGTERM)
        for runner in self.runners:
            try:
                runner.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                runner.proc.kill()
                runner.proc.wait(timeout=10)


@pytest.fixture
async def cluster(short_tmp: Path, pg: str, fake_model: FakeModel) -> AsyncIterator[Cluster]:
    found = Cluster(short_tmp, pg, fake_model)
    try:
        yield found
    finally:
        await asyncio.to_thread(found.stop_all)


def coordinator_settings(tmp: Path, pg: str, name: str, **extra: Any) -> Settings:
    # A runner is taken for gone after 30 s without a heartbeat: the tests here are about routing,
    # not lapses, and on a loaded machine a runner busy starting a sandbox, or a coordinator on the
    # test's own loop, can miss a few seconds of them (a 3 s liveness answered a message 503 in CI).
    # The lapse tests use `local_settings`' 3 s.
    return Settings(mode="coordinator", data_dir=str(tmp / f"cd-{name}"), database_url=pg, internal_secret=SECRET,
                    api_key=API_KEY,
                    credential_key=CREDENTIAL_KEY, prewarm=0, zygote=False, anthropic_base_url=None,
                    rate_limit_rps=1000.0, rate_limit_burst=1000, actor_timeout_seconds=30.0,
                    **{"runner_liveness_seconds": 30.0, **extra})


def local_settings(tmp: Path, pg: str, name: str, **extra: Any) -> Settings:
    """A coordinator with a local pool, which registers as a runner on its own runner port."""
    return coordinator_settings(tmp, pg, name, coordinator_local=True, runner_port=free_port(),
                                runner_advertise_host="127.0.0.1", runner_heartbeat_seconds=0.5,
                                runner_sweep_seconds=0.5, runner_sweep_jitter_seconds=0.0,
                                **{"runner_liveness_seconds": 3.0, **extra})


@pytest.fixture
async def coordinator(aiohttp_client: Any, short_tmp: Path, pg: str) -> AsyncIterator[Api]:
    server, api = await start_api(aiohttp_client, coordinator_settings(short_tmp, pg, "a"))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


def url_of(api: Api) -> str:
    return str(api.client.make_url("")).rstrip("/")


# The runners this test process started last, by id: a wait for one that exited says why at once.
_STARTED: dict[str, RunnerProc] = {}


async def wait_registered(api: Api, *runner_ids: str, timeout: float = 90.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        status, body = await api.call("GET", "/api/internal/runners", key=SECRET)
        assert status == 200, body
        runners = body["runners"]
        seen = {r["runnerId"] for r in runners}
        if seen >= set(runner_ids):
            return list(runners)
        for runner_id in set(runner_ids) - seen:
            started = _STARTED.get(runner_id)
            if started is not None and started.proc.poll() is not None:
                raise AssertionError(f"runner {runner_id} exited ({started.proc.returncode}) before it "
                                     f"registered:\n{started.output()[-3000:]}")
        if time.monotonic() >= deadline:
            logs = {i: _STARTED[i].output()[-2000:] for i in set(runner_ids) - seen if i in _STARTED}
            raise AssertionError(f"runners {runner_ids} did not register: {runners}\n{logs}")
        await asyncio.sleep(0.2)


async def deploy(api: Api, agent_dir: Path, name: str = "ra") -> None:
    status, body = await api.call("POST", "/api/agents", json={"name": name, "path": str(agent_dir)})
    assert status == 201, body


async def create(api: Api, agent: str = "ra") -> dict[str, Any]:
    status, body = await api.call("POST", "/api/sessions", json={"agent": agent})
    assert status == 201, body
    return dict(body["session"])


async def turn(api: Api, sid: str, content: str) -> list[Any]:
    resp = await api.client.post(f"/api/sessions/{sid}/messages", headers=api.headers(), json={"content": content})
    assert resp.status == 200, await resp.text()
    return parse_frames(await resp.text())


async def test_a_session_through_the_coordinator_runs_on_its_runner(cluster: Cluster, coordinator: Api,
                                                                    agent_dir: Path) -> None:
    runner = cluster.start_runner("r-one", url_of(coordinator))
    await wait_registered(coordinator, "r-one")
    await deploy(coordinator, agent_dir)
    session = await create(coordinator)
    sid = session["id"]
    assert session["runnerId"] == "r-one" and session["status"] == "active"

    frames = await turn(coordinator, sid, "hello through two hops")
    assert frames[-1].event == "done" and frames[-1].data == {"sessionId": sid}
    ids = [f.id for f in frames if f.id is not None]
    assert ids == sorted(ids) and len(ids) == len(set(ids)) and ids, frames
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/messages")
    assert status == 200 and any(m["role"] == "user" for m in body["messages"]), body

    # Files: list, raw, json; an upload; a command.
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/files")
    assert status == 200 and body["source"] == "sandbox", body
    assert "notes.txt" in {f["path"] for f in body["files"]}
    resp = await coordinator.client.get(f"/api/sessions/{sid}/files/notes.txt", headers=coordinator.headers())
    assert resp.status == 200 and await resp.text() == "from the agent folder\n"
    assert resp.headers["X-Service-Source"] == "sandbox"
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/files/notes.txt?format=json")
    assert status == 200 and body["content"] == "from the agent folder\n", body
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/files/missing.txt")
    assert status == 404, body
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/files", json={
        "files": [{"path": "up.txt", "content": "uploaded", "encoding": "utf-8"}]})
    assert status == 200, body
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/exec", json={"command": "cat up.txt"})
    assert status == 200 and body["stdout"] == "uploaded" and body["exitCode"] == 0, body

    # Pause and resume through the coordinator: refusals are the runner's own ApiErrors.
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200 and body["session"]["status"] == "paused", body
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 400 and "paused" in body["error"] and body["statusCode"] == 400, body
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active" and body["session"]["runnerId"] == "r-one", body
    frames = await turn(coordinator, sid, "after the resume")
    assert frames[-1].event == "done"
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["runnerId"] == "r-one"
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/interrupt")
    assert status == 409 and body["error"] == "No turn is running", body

    # The workspace as a bundle, restored into a fork that runs on the same runner.
    resp = await coordinator.client.get(f"/api/sessions/{sid}/workspace", headers=coordinator.headers())
    assert resp.status == 200 and resp.headers["X-Service-Source"] == "sandbox"
    bundle = await resp.read()
    assert int(resp.headers["Content-Length"]) == len(bundle) > 0
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/fork")
    assert status == 201 and body["session"]["runnerId"] == "r-one", body
    child = body["session"]["id"]
    status, body = await coordinator.call("POST", f"/api/sessions/{child}/exec", json={"command": "rm up.txt"})
    assert status == 200 and body["exitCode"] == 0, body
    status, body = await coordinator.call("POST", f"/api/sessions/{child}/workspace",
                                          json={"bundle": base64.b64encode(bundle).decode()})
    assert status == 200 and body["restored"] > 0, body
    status, body = await coordinator.call("GET", f"/api/sessions/{child}/files/up.txt?format=json")
    assert status == 200 and body["content"] == "uploaded", body

    status, body = await coordinator.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "ended", body
    assert runner.proc.poll() is None


async def test_routing_by_capacity_over_two_runners(cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    cluster.start_runner("r-small", url_of(coordinator), max_sandboxes=1)
    cluster.start_runner("r-large", url_of(coordinator), max_sandboxes=3)
    await wait_registered(coordinator, "r-small", "r-large")
    await deploy(coordinator, agent_dir)
    # Four creates at once (within one read of the runners table): free capacity 3 against 1, the
    # placed ones counted, ties to the lowest id: three on the large runner, one on the small one.
    placed = [s["runnerId"] for s in await asyncio.gather(*(create(coordinator) for _ in range(4)))]
    assert sorted(placed) == ["r-large", "r-large", "r-large", "r-small"], placed
    status, body = await coordinator.call("GET", "/api/sessions")
    assert sorted(s["runnerId"] for s in body["sessions"]) == sorted(placed)


async def test_short_sessions_between_two_heartbeats_are_not_refused_on_an_idle_runner(
        cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    # One sandbox, and a heartbeat seldom enough that these creates all fall between two: the
    # coordinator counts each one it placed as running until the next heartbeat, though each was
    # deleted before the next create. It used to answer 503 "no runners are available" from the
    # second create on; the runner itself has room, and says so.
    cluster.start_runner("r-one", url_of(coordinator), max_sandboxes=1,
                         env={"SERVICE_RUNNER_HEARTBEAT_SECONDS": "20"})
    await wait_registered(coordinator, "r-one")
    await deploy(coordinator, agent_dir)
    for _ in range(3):
        session = await create(coordinator)
        assert session["runnerId"] == "r-one", session
        status, body = await coordinator.call("DELETE", f"/api/sessions/{session['id']}")
        assert status == 200, body


async def test_no_runner_is_503_and_the_fallback_setting_serves_locally(
        cluster: Cluster, aiohttp_client: Any, short_tmp: Path, pg: str, agent_dir: Path) -> None:
    server, api = await start_api(aiohttp_client, coordinator_settings(short_tmp, pg, "none"))
    try:
        await deploy(api, agent_dir)
        status, body = await api.call("POST", "/api/sessions", json={"agent": "ra"})
        assert status == 503 and body["statusCode"] == 503, body
        assert "no runners are available" in body["error"].lower() and "no local backend" in body["error"], body
        assert server.components is not None and server.components.local is None
        status, body = await api.call("GET", "/api/internal/runners", key=SECRET)
        assert status == 200 and body["hasLocal"] is False
    finally:
        await api.client.close()
        await server.stop()
    server, api = await start_api(aiohttp_client, local_settings(short_tmp, pg, "local"))
    try:
        status, body = await api.call("GET", "/api/internal/runners", key=SECRET)
        assert status == 200 and body["hasLocal"] is True
        session = await create(api)
        # The local pool is registered as a runner: its sessions carry its id (the coordinator's owner id).
        assert server.components is not None and server.components.local is not None
        assert session["runnerId"] == server.components.local.owner_id and session["status"] == "active"
        frames = await turn(api, session["id"], "served by the coordinator itself")
        assert frames[-1].event == "done"
    finally:
        await api.client.close()
        await server.stop()


async def test_the_runner_api_refuses_a_missing_or_wrong_secret(cluster: Cluster, coordinator: Api) -> None:
    runner = cluster.start_runner("r-secret", url_of(coordinator))
    await wait_registered(coordinator, "r-secret")
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong-secret"}, {"Authorization": SECRET}):
            async with http.post(f"{runner.url}/runner/sessions", json={"tenant": "default"},
                                 headers=headers) as resp:
                assert resp.status == 401, headers
                body = await resp.json()
                assert body["statusCode"] == 401 and "SERVICE_INTERNAL_SECRET" in body["error"]
        async with http.get(f"{runner.url}/runner/sessions/x", params={"tenant": "default"},
                            headers={"Authorization": f"Bearer {SECRET}"}) as resp:
            assert resp.status == 404  # the right secret passes: the session does not exist


async def test_a_dropped_client_replays_through_a_second_coordinator(
        cluster: Cluster, coordinator: Api, aiohttp_client: Any, short_tmp: Path, pg: str, agent_dir: Path) -> None:
    cluster.start_runner("r-replay", url_of(coordinator))
    await wait_registered(coordinator, "r-replay")
    await deploy(coordinator, agent_dir)
    sid = (await create(coordinator))["id"]
    token = "slow-turn-" + secrets.token_hex(4)
    cluster.fake.script(token, [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo one"}}]},
        {"content": [{"type": "text", "text": "z" * 150}], "chunk": 1, "delay": 0.03},
    ])
    resp = await coordinator.client.post(f"/api/sessions/{sid}/messages", headers=coordinator.headers(),
                                         json={"content": token, "includePartialMessages": True})
    assert resp.status == 200
    seen: list[Any] = []
    buffer = b""
    while len(seen) < 3 or not any(f.id for f in seen):  # a few frames, one stored, then hang up mid-turn
        chunk = await resp.content.readany()
        assert chunk, "the stream ended before the client hung up"
        buffer += chunk
        *blocks, buffer = buffer.split(b"\n\n")
        seen += [f for b in blocks for f in parse_frames(b.decode() + "\n\n")]
    resp.close()
    last_id = max(f.id for f in seen if f.id is not None)

    server2, second = await start_api(aiohttp_client, coordinator_settings(short_tmp, pg, "b"))
    try:
        resp = await second.client.get(f"/api/sessions/{sid}/stream",
                                       headers={**second.headers(coordinator.key), "Last-Event-ID": str(last_id)})
        assert resp.status == 200
        rest = parse_frames(await resp.text())
    finally:
        await second.client.close()
        await server2.stop()
    assert rest and rest[-1].event == "done", rest
    ids = [f.id for f in seen if f.id is not None] + [f.id for f in rest if f.id is not None]
    assert ids == sorted(set(ids)), ids  # every frame once, in order
    # Exactly what the database holds for the turn: nothing missed in between, nothing twice.
    resp = await coordinator.client.get(f"/api/sessions/{sid}/stream?after=0", headers=coordinator.headers())
    stored = [f.id for f in parse_frames(await resp.text())]
    assert ids == [i for i in stored if i is not None and i >= ids[0]], (ids, stored)


async def test_registration_retries_until_the_coordinator_is_up_and_sigterm_deregisters(
        cluster: Cluster, aiohttp_client: Any, short_tmp: Path, pg: str) -> None:
    port = free_port()
    runner = cluster.start_runner("r-early", f"http://127.0.0.1:{port}")
    await asyncio.sleep(3)  # the runner is up and retrying; nothing listens on the coordinator's port yet
    assert runner.proc.poll() is None, runner.output()
    settings = coordinator_settings(short_tmp, pg, "late", host="127.0.0.1", port=port)
    server = Server(settings)
    await server.serve()
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 60
            while True:
                async with http.get(f"http://127.0.0.1:{port}/api/internal/runners",
                                    headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                    runners = (await resp.json())["runners"]
                if any(r["runnerId"] == "r-early" for r in runners):
                    break
                assert time.monotonic() < deadline, runner.output()
                await asyncio.sleep(0.2)
            beat = runners[0]["lastHeartbeatAt"]
            await asyncio.sleep(1.5)
            async with http.get(f"http://127.0.0.1:{port}/api/internal/runners",
                                headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                assert (await resp.json())["runners"][0]["lastHeartbeatAt"] > beat  # heartbeats arrive
            # A coordinator that forgets the runner answers its next heartbeat 404: it registers again.
            async with http.post(f"http://127.0.0.1:{port}/api/internal/runners/deregister",
                                 json={"runnerId": "r-early"}, headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                assert resp.status == 200
            deadline = time.monotonic() + 30
            while True:
                async with http.get(f"http://127.0.0.1:{port}/api/internal/runners",
                                    headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                    if [r["runnerId"] for r in (await resp.json())["runners"]] == ["r-early"]:
                        break
                assert time.monotonic() < deadline, runner.output()
                await asyncio.sleep(0.2)
            runner.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(runner.proc.wait, 60) == 0, runner.output()
            async with http.get(f"http://127.0.0.1:{port}/api/internal/runners",
                                headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                assert (await resp.json())["runners"] == []
        log = [json.loads(line) for line in runner.output().splitlines() if line.startswith("{")]
        assert any("deregistered" in line.get("message", line.get("msg", "")) for line in log), runner.output()
    finally:
        await server.stop()


@pytest.mark.parametrize("store", [False, True], ids=["no-snapshot-store", "shared-snapshot-store"])
async def test_a_session_whose_runner_is_gone_resumes_cold_on_another(
        cluster: Cluster, coordinator: Api, agent_dir: Path, store: bool) -> None:
    env = {"SERVICE_SNAPSHOT_URL": f"file://{cluster.tmp / 'snapshots'}"} if store else {}
    first = cluster.start_runner("r-first", url_of(coordinator), env=env)
    await wait_registered(coordinator, "r-first")
    await deploy(coordinator, agent_dir)
    session = await create(coordinator)
    sid = session["id"]
    assert session["runnerId"] == "r-first"
    assert (await turn(coordinator, sid, "remember this turn"))[-1].event == "done"
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/exec",
                                          json={"command": "echo made-on-first > made.txt"})
    assert status == 200 and body["exitCode"] == 0, body
    cluster.start_runner("r-second", url_of(coordinator), env=env)
    await wait_registered(coordinator, "r-second")

    # The first runner stops (graceful): its sessions are paused and it leaves the registry.
    first.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.proc.wait, 60) == 0, first.output()
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "paused" and body["session"]["runnerId"] == "r-first", body
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/exec", json={"command": "true"})
    assert status == 400 and "resume" in body["error"], body  # not silently restarted elsewhere

    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200, body
    resumed = body["session"]
    assert resumed["status"] == "active" and resumed["runnerId"] == "r-second", resumed
    assert resumed["workspaceRestored"] is store, resumed
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/events")
    lifecycle = [json.loads(e["data"]) for e in body["events"] if e["type"] == "lifecycle"]
    assert lifecycle[-1]["action"] == "resumed" and lifecycle[-1]["workspaceRestored"] is store, lifecycle
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/files")
    names = {f["path"] for f in body["files"]}
    assert "notes.txt" in names  # the agent folder, fresh or restored
    assert ("made.txt" in names) is store, names
    # The conversation went along: the model sees the first turn in the second one's request.
    token = "second-runner-" + secrets.token_hex(4)
    assert (await turn(coordinator, sid, token))[-1].event == "done"
    [request] = cluster.fake.requests_containing(token)[:1]
    assert "remember this turn" in json.dumps(request["body"]["messages"])


async def test_a_draining_runner_sends_new_sessions_elsewhere_and_finishes_its_turn(
        cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    from tests.integration.test_session_stream import _wait_for

    big = cluster.start_runner("r-big", url_of(coordinator), max_sandboxes=4)
    await wait_registered(coordinator, "r-big")
    await deploy(coordinator, agent_dir)
    sid = (await create(coordinator))["id"]
    cluster.start_runner("r-tiny", url_of(coordinator), max_sandboxes=1)
    await wait_registered(coordinator, "r-tiny")
    token = "long-turn-" + secrets.token_hex(4)
    cluster.fake.script(token, [{"content": [{"type": "text", "text": "z" * 120}], "chunk": 1, "delay": 0.04}])
    running = asyncio.ensure_future(turn(coordinator, sid, token))
    # The turn is under way on r-big (its model call made) before r-big is told to drain: on a busy
    # machine a fixed wait let the drain pause the session before the message reached it.
    await _wait_for(lambda: _has_request(cluster.fake, token), timeout=60)
    big.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    # r-big still has the most room on paper, but it refuses while it drains: the create goes on.
    session = await create(coordinator)
    assert session["runnerId"] == "r-tiny", session
    frames = await running
    assert frames[-1].event == "done", frames  # the running turn finished before the runner left
    assert await asyncio.to_thread(big.proc.wait, 60) == 0, big.output()
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "paused", body


async def test_an_agent_deployed_with_files_runs_on_a_runner(cluster: Cluster, coordinator: Api) -> None:
    cluster.start_runner("r-files", url_of(coordinator))
    await wait_registered(coordinator, "r-files")
    status, body = await coordinator.call("POST", "/api/agents", json={"name": "managed", "files": [
        {"path": "AGENT.md", "content": "Deployed through the coordinator."},
        {"path": "data/info.txt", "content": "only in the database"}]})
    assert status == 201, body
    sid = (await create(coordinator, "managed"))["id"]
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/files/data/info.txt?format=json")
    assert status == 200 and body["content"] == "only in the database", body


async def test_backpressure_and_the_read_timeout_hold_through_two_hops(
        cluster: Cluster, coordinator: Api, agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ashd.http import _sse
    from tests.integration.test_session_stream import _dechunk, _raw_post, _turn_completed, _wait_for

    cluster.start_runner("r-slow", url_of(coordinator))
    await wait_registered(coordinator, "r-slow")
    await deploy(coordinator, agent_dir)
    pieces = 20_000  # ~3 MB of frames: far more than the sockets and buffers of both hops hold
    token = "two-hop-stream-" + secrets.token_hex(4)
    cluster.fake.script(token, [{"content": [{"type": "text", "text": "y" * pieces}], "chunk": 1}])

    # A client that holds still: the agent on the runner waits; nothing completes meanwhile.
    sid = (await create(coordinator))["id"]
    reader, writer = await _raw_post(coordinator, sid, {"content": token, "includePartialMessages": True})
    await _wait_for(lambda: _has_request(cluster.fake, token))
    for _ in range(30):
        assert not await _turn_completed(coordinator, sid)
        await asyncio.sleep(0.05)
    async with asyncio.timeout(120):
        rest = await reader.read(-1)  # reading again: every frame arrives, in order, then done
    writer.close()
    frames = parse_frames(_dechunk(rest))
    deltas = [f for f in frames if f.event == "message" and f.data["type"] == "stream_event"
              and f.data["event"]["type"] == "content_block_delta"]
    assert len(deltas) == pieces and frames[-1].event == "done"

    # A client that stops for longer than the read timeout is dropped by the coordinator; the turn
    # runs on at the runner and is stored.
    monkeypatch.setattr(_sse, "CLIENT_READ_TIMEOUT", 0.5)
    token2 = token + "-again"
    cluster.fake.script(token2, [{"content": [{"type": "text", "text": "y" * pieces}], "chunk": 1}])
    reader, writer = await _raw_post(coordinator, sid, {"content": token2, "includePartialMessages": True})
    await _wait_for(lambda: _turn_completed_twice(coordinator, sid), timeout=120)
    async with asyncio.timeout(30):
        tail = await reader.read(-1)  # the coordinator closed the connection
    writer.close()
    assert b"event: done" not in tail


async def _has_request(fake: FakeModel, token: str) -> bool:
    return bool(fake.requests_containing(token))


async def _turn_completed_twice(api: Api, sid: str) -> bool:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=turn_complete")
    return len(body["events"]) >= 2


@pytest.mark.parametrize(("env", "says"), [
    ({"SERVICE_SERVER_URL": "http://127.0.0.1:9", "SERVICE_DATABASE_URL": "postgresql://x@127.0.0.1/x"},
     "SERVICE_INTERNAL_SECRET must be set on a runner"),
    ({"SERVICE_INTERNAL_SECRET": SECRET, "SERVICE_DATABASE_URL": "postgresql://x@127.0.0.1/x"},
     "needs SERVICE_SERVER_URL"),
    ({"SERVICE_INTERNAL_SECRET": SECRET, "SERVICE_SERVER_URL": "http://127.0.0.1:9"},
     "needs SERVICE_DATABASE_URL"),
], ids=["no-secret", "no-server", "no-database"])
def test_a_runner_without_its_coordinator_settings_says_which(short_tmp: Path, env: dict[str, str], says: str) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    full.update({"SERVICE_DATA_DIR": str(short_tmp / "d"), "SERVICE_RUNNER_PORT": str(free_port()), **env})
    result = subprocess.run([sys.executable, "-m", "ashd", "runner"], env=full, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr, result.stderr


async def test_a_runner_killed_mid_turn_cuts_the_clients_stream_at_once(
        cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    runner = cluster.start_runner("r-killed", url_of(coordinator))
    await wait_registered(coordinator, "r-killed")
    await deploy(coordinator, agent_dir)
    sid = (await create(coordinator))["id"]
    token = "killed-mid-turn-" + secrets.token_hex(4)
    cluster.fake.script(token, [{"content": [{"type": "text", "text": "z" * 200}], "chunk": 1, "delay": 0.05}])
    resp = await coordinator.client.post(f"/api/sessions/{sid}/messages", headers=coordinator.headers(),
                                         json={"content": token, "includePartialMessages": True})
    assert resp.status == 200
    got = await resp.content.readuntil(b"\n\n")
    runner.proc.kill()
    killed_at = time.monotonic()
    # A connection-level failure, not a frame (the interface's Events rule 5): the client's
    # connection breaks as soon as the coordinator loses the runner, so it reconnects at once.
    with pytest.raises(aiohttp.ClientPayloadError):
        async with asyncio.timeout(20):
            while chunk := await resp.content.readany():
                got += chunk
    assert time.monotonic() - killed_at < 10
    assert b"event: done" not in got
    runner.proc.wait(timeout=30)


async def test_an_unreachable_runner_is_named_and_passed_over(cluster: Cluster, coordinator: Api,
                                                              agent_dir: Path) -> None:
    await deploy(coordinator, agent_dir)
    ghost = {"runnerId": "r-ghost", "host": "127.0.0.1", "port": free_port(), "maxSandboxes": 100}
    status, body = await coordinator.call("POST", "/api/internal/runners/register", key=SECRET, json=ghost)
    assert status == 200, body
    status, body = await coordinator.call("POST", "/api/sessions", json={"agent": "ra"})
    assert status == 503 and "r-ghost" in body["error"] and "unreachable" in body["error"], body

    cluster.start_runner("r-real", url_of(coordinator), max_sandboxes=2)
    await wait_registered(coordinator, "r-real")
    status, body = await coordinator.call("POST", "/api/internal/runners/register", key=SECRET, json=ghost)
    assert status == 200, body  # fresh again: the ghost has the most room on paper
    session = await create(coordinator)
    assert session["runnerId"] == "r-real", session


async def test_a_runner_full_at_the_door_sends_the_create_to_the_next_one(
        cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    full = cluster.start_runner("r-a-full", url_of(coordinator), max_sandboxes=1)
    cluster.start_runner("r-b-spare", url_of(coordinator), max_sandboxes=1)
    await wait_registered(coordinator, "r-a-full", "r-b-spare")
    await deploy(coordinator, agent_dir)
    busy = await create(coordinator)
    assert busy["runnerId"] == "r-a-full", busy  # a tie: the lowest id
    token = "long-turn-" + secrets.token_hex(4)
    cluster.fake.script(token, [{"content": [{"type": "text", "text": "z" * 120}], "chunk": 1, "delay": 0.04}])
    running = asyncio.ensure_future(turn(coordinator, busy["id"], token))

    async def its_one_sandbox_runs_the_turn() -> bool:
        async with aiohttp.ClientSession() as client, client.get(f"{full.url}/health") as resp:
            return bool((await resp.json())["pool"]["running"] == 1)

    async with asyncio.timeout(30):
        while not await its_one_sandbox_runs_the_turn():
            await asyncio.sleep(0.05)
    # The coordinator's copy says r-a-full has the most room (as a heartbeat a moment old would):
    # the runner refuses at the door, storing nothing, and the create goes on to the next runner.
    stale = {"runnerId": "r-a-full", "host": "127.0.0.1", "port": full.port, "maxSandboxes": 100}
    status, body = await coordinator.call("POST", "/api/internal/runners/register", key=SECRET, json=stale)
    assert status == 200, body
    await asyncio.sleep(1.2)  # past the 1 s a coordinator keeps its copy of the runners table
    placed = await create(coordinator)
    assert placed["runnerId"] == "r-b-spare", placed
    status, body = await coordinator.call("GET", "/api/sessions")
    assert sorted((s["id"], s["status"]) for s in body["sessions"]) == sorted(
        [(busy["id"], "active"), (placed["id"], "active")]), body  # no session left behind in error
    assert (await running)[-1].event == "done"


async def test_a_session_paused_behind_its_runners_back_resumes_warm_there(
        cluster: Cluster, coordinator: Api, agent_dir: Path) -> None:
    """A coordinator paused the runner's sessions in the shared database (it thought the runner gone:
    here, a deregistration the runner did not ask for). The runner, still alive, registers again at
    its next heartbeat; it does not trust its cached view of the session: the client's resume is a
    real (warm) one and is stored, and a message before it is refused as for any paused session."""
    cluster.start_runner("r-back", url_of(coordinator))
    await wait_registered(coordinator, "r-back")
    await deploy(coordinator, agent_dir)
    sid = (await create(coordinator))["id"]
    status, body = await coordinator.call("POST", "/api/internal/runners/deregister", key=SECRET,
                                          json={"runnerId": "r-back"})
    assert status == 200 and body["pausedSessions"] == 1, body
    await wait_registered(coordinator, "r-back")  # a heartbeat answered 404: registered again
    resp = await coordinator.client.post(f"/api/sessions/{sid}/messages", headers=coordinator.headers(),
                                         json={"content": "too early"})
    assert resp.status == 400 and "resume" in (await resp.json())["error"]
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/resume")
    assert status == 200 and body["session"]["status"] == "active", body
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "active" and body["session"]["runnerId"] == "r-back", body
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/events")
    resumed = [json.loads(e["data"]) for e in body["events"] if e["type"] == "lifecycle"][-1]
    assert resumed == {"action": "resumed", "status": "active", "path": "warm"}, resumed
    assert (await turn(coordinator, sid, "after the resume"))[-1].event == "done"


async def test_message_options_attachments_config_and_logs_reach_the_runner(
        cluster: Cluster, coordinator: Api, agent_dir: Path, fake_model: FakeModel) -> None:
    """What the coordinator checked (message options, attachment ids, a config change) is carried to the
    runner as it came; logs and attachments are read from the shared database on any coordinator."""
    cluster.start_runner("r-opts", url_of(coordinator))
    await wait_registered(coordinator, "r-opts")
    await deploy(coordinator, agent_dir)
    sid = (await create(coordinator))["id"]

    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/attachments", json={
        "filename": "facts.txt", "content": base64.b64encode(b"the sky is green\n").decode()})
    assert status == 201, body
    attachment = body["attachment"]["id"]
    resp = await coordinator.client.post(f"/api/sessions/{sid}/messages", headers=coordinator.headers(), json={
        "content": "read the attachment", "attachments": [attachment], "maxTurns": 3})
    assert resp.status == 200, await resp.text()
    assert parse_frames(await resp.text())[-1].event == "done"
    status, body = await coordinator.call("POST", f"/api/sessions/{sid}/exec",
                                          json={"command": "cat attachments/facts.txt"})
    if not (status == 200 and body["stdout"] == "the sky is green\n"):
        _, seen = await coordinator.call("POST", f"/api/sessions/{sid}/exec",
                                         json={"command": "id; umask; ls -lan . attachments; pwd"})
        raise AssertionError(f"{body}; in the sandbox: {seen}")
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/messages")
    users = [m for m in body["messages"] if m["role"] == "user"]
    assert status == 200 and attachment in json.dumps(users[-1]), users

    status, body = await coordinator.call("PATCH", f"/api/sessions/{sid}/config",
                                          json={"allowedTools": ["Read"], "betas": ["context-1m-2025-08-07"]})
    assert status == 200 and body["session"]["id"] == sid and body["session"]["runnerId"] == "r-opts", body
    assert body["session"]["allowedTools"] == ["Read"], body
    status, body = await coordinator.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["allowedTools"] == ["Read"], body
    assert (await turn(coordinator, sid, "RUNNER-PATCHED hi"))[-1].event == "done"
    patched = fake_model.requests_containing("RUNNER-PATCHED")[0]
    assert {t["name"] for t in patched["body"]["tools"]} == {"Read"}
    status, body = await coordinator.call("PATCH", f"/api/sessions/{sid}/config", json={"modle": "x"})
    assert status == 400 and "modle" in body["error"], body

    status, body = await coordinator.call("GET", f"/api/sessions/{sid}/logs")
    assert status == 200 and isinstance(body["logs"], list) and body["source"] == "live", body


async def test_local_pools_of_two_coordinators_serve_each_others_sessions_and_a_dead_ones_resume(
        aiohttp_client: Any, short_tmp: Path, pg: str, fake_model: FakeModel, agent_dir: Path) -> None:
    """SERVICE_COORDINATOR_LOCAL on two coordinators behind one database: a session in one's pool,
    used through the other, runs in that one sandbox (one workspace, not two); when its coordinator
    dies (heartbeats stop), the other's sweep pauses the session and it resumes in the other's pool
    with its files."""
    store = {"snapshot_url": f"file://{short_tmp / 'snapshots'}"}
    servers: list[tuple[Server, Api]] = []
    try:
        for name in ("la", "lb"):
            servers.append(await start_api(aiohttp_client, local_settings(short_tmp, pg, name, **store)))
        ids = []
        for server, _ in servers:
            assert server.components is not None and server.components.local is not None
            ids.append(server.components.local.owner_id)
        assert ids[0] != ids[1]
        await wait_registered(servers[1][1], *ids)
        await deploy(servers[0][1], agent_dir)
        status, body = await servers[0][1].call("POST", "/api/sessions", json={"agent": "ra"})
        assert status == 201 and body["session"]["runnerId"] in ids, body  # the pools are placed like runners
        sid = body["session"]["id"]
        home = ids.index(body["session"]["runnerId"])
        (home_server, home_api), (other_server, other_api) = servers[home], servers[1 - home]

        # Through the other coordinator: the same sandbox. A file written there is read through the
        # home coordinator, and back.
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/exec",
                                            json={"command": "echo via-other > made.txt"})
        assert status == 200 and body["exitCode"] == 0, body
        status, body = await home_api.call("POST", f"/api/sessions/{sid}/exec",
                                           json={"command": "cat made.txt; echo x >> made.txt"})
        assert status == 200 and body["stdout"] == "via-other\n", body
        status, body = await other_api.call("GET", f"/api/sessions/{sid}/files/made.txt?format=json")
        assert status == 200 and body["content"] == "via-other\nx\n", body
        assert (await turn(other_api, sid, "a turn through the other coordinator"))[-1].event == "done"
        assert other_server.components is not None and other_server.components.local is not None
        assert other_server.components.local.registry.live_actors() == 0  # no sandbox of its own for it
        status, body = await other_api.call("GET", "/api/internal/runners", key=SECRET)
        rows = {r["runnerId"]: r for r in body["runners"]}
        assert rows[ids[home]]["stats"]["coordinatorLocal"] == 1 and rows[ids[home]]["alive"] is True, rows

        # Pause and resume through the other coordinator: the home pool's sandbox takes the snapshot
        # that a resume elsewhere restores (a crash loses only what came after the last one).
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/pause")
        assert status == 200 and body["session"]["status"] == "paused", body
        deadline = time.monotonic() + 30
        while True:  # the snapshot is taken off the request path
            status, body = await other_api.call("GET", f"/api/sessions/{sid}/files/made.txt?format=json")
            if status == 200:
                break
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.3)
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/resume")
        assert status == 200 and body["session"]["runnerId"] == ids[home], body

        # The home coordinator dies: its heartbeats stop. The other's sweep pauses its session.
        await home_server.local_runner.stop_heartbeats()
        deadline = time.monotonic() + 30
        while True:
            status, body = await other_api.call("GET", f"/api/sessions/{sid}")
            if body["session"]["status"] == "paused":
                break
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.3)
        await home_api.client.close()
        await home_server.stop()
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/resume")
        assert status == 200, body
        resumed = body["session"]
        assert resumed["status"] == "active" and resumed["runnerId"] == ids[1 - home], resumed
        assert resumed["workspaceRestored"] is True, resumed
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/exec", json={"command": "cat made.txt"})
        assert status == 200 and body["stdout"] == "via-other\nx\n", body
        assert (await turn(other_api, sid, "after the move"))[-1].event == "done"
    finally:
        for server, api in servers:
            await api.client.close()
            await server.stop()


async def test_a_local_session_from_before_pools_registered_is_refused_by_another_coordinator(
        aiohttp_client: Any, short_tmp: Path, pg: str, agent_dir: Path) -> None:
    """A row of a local pool stored before pools registered as runners (`runnerId` null, another
    coordinator's owner id) is never started in a second sandbox here: a live call is 503 naming the
    coordinator and saying to resume it."""
    from sqlalchemy import text

    server, api = await start_api(aiohttp_client, local_settings(short_tmp, pg, "legacy"))
    try:
        await deploy(api, agent_dir)
        sid = (await create(api))["id"]
        assert server.components is not None
        async with server.components.db.tx() as s:
            await s.execute(text("UPDATE sessions SET runner_id = NULL, owner_id = 'srv-elsewhere' WHERE id = :id"),
                            {"id": sid})
        status, body = await api.call("POST", f"/api/sessions/{sid}/exec", json={"command": "true"})
        assert status == 503 and body["statusCode"] == 503, body
        assert "local pool of coordinator srv-elsewhere" in body["error"] and "/resume" in body["error"], body
    finally:
        await api.client.close()
        await server.stop()


async def test_a_runner_thought_dead_cannot_pause_its_session_once_it_runs_elsewhere(
        aiohttp_client: Any, short_tmp: Path, pg: str, fake_model: FakeModel, agent_dir: Path) -> None:
    """Split brain: a runner (here a coordinator's local pool) is declared dead while it still runs,
    its session is resumed on another runner, and then the first one, which still holds the old
    sandbox and an old view of the session, pauses it (its own graceful stop). That write must not
    land: the session stays active where it runs now, and its next turn works."""
    servers: list[tuple[Server, Api]] = []
    try:
        for name in ("sa", "sb"):
            servers.append(await start_api(aiohttp_client, local_settings(short_tmp, pg, name)))
        ids = []
        for server, _ in servers:
            assert server.components is not None and server.components.local is not None
            ids.append(server.components.local.owner_id)
        await wait_registered(servers[1][1], *ids)
        await deploy(servers[0][1], agent_dir)
        status, body = await servers[0][1].call("POST", "/api/sessions", json={"agent": "ra"})
        assert status == 201, body
        sid = body["session"]["id"]
        home = ids.index(body["session"]["runnerId"])
        (home_server, home_api), (_, other_api) = servers[home], servers[1 - home]
        assert (await turn(home_api, sid, "a turn on the first runner"))[-1].event == "done"

        # The first runner goes silent without stopping: the other's sweep declares it dead.
        assert home_server.local_runner is not None
        await home_server.local_runner.stop_heartbeats()
        deadline = time.monotonic() + 30
        while (await other_api.call("GET", f"/api/sessions/{sid}"))[1]["session"]["status"] != "paused":
            assert time.monotonic() < deadline, "the sweep never paused the silent runner's session"
            await asyncio.sleep(0.3)
        status, body = await other_api.call("POST", f"/api/sessions/{sid}/resume")
        assert status == 200 and body["session"]["runnerId"] == ids[1 - home], body

        # The first runner, still up with its old sandbox, stops gracefully: it pauses what it
        # believes are its active sessions.
        await home_api.client.close()
        await home_server.stop()

        status, body = await other_api.call("GET", f"/api/sessions/{sid}/events")
        actions = [json.loads(e["data"]).get("action") for e in body["events"] if e["type"] == "lifecycle"]
        assert actions[-1] == "resumed", actions  # nothing written after the move
        assert (await turn(other_api, sid, "a turn after the move"))[-1].event == "done"
        status, body = await other_api.call("GET", f"/api/sessions/{sid}")
        assert body["session"]["status"] == "active" and body["session"]["runnerId"] == ids[1 - home], body
    finally:
        for server, api in servers:
            await api.client.close()
            await server.stop()
