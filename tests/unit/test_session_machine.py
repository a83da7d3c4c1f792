"""The session's state machine on its own: SessionActor messages, no HTTP.

Real parts: the session rows in SQLite, a real PoolActor, and real bridge processes (unsandboxed,
tests/fixtures/plain_launcher.py) that the actor connects to and configures; credentials in the
real credential store; where a test asks (`open_machine`), a real SnapshotActor, LogTails and a
ModelProxy in front of the fake model. Each rejection of
the state table is checked with the exact status the API answers; each accepted transition by
the stored row the next request reads. The HTTP view of the same table is
tests/integration/test_session_states.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from sqlalchemy import delete, update

from ashd.actors._activity import Activity
from ashd.actors._aio import ActorGone, call
from ashd.actors._owed import OwedSnapshots
from ashd.actors._pool import PoolActor, PoolConfig
from ashd.actors._pool_types import LossReason, SandboxLost
from ashd.actors._session import SessionActor
from ashd.actors._session_deps import CreateRequest, SessionDeps
from ashd.actors._session_logs import LogTails
from ashd.actors._sessions import SessionRegistry, outcome_of
from ashd.actors._snapshot import SnapshotActor, snapshot_proxy
from ashd.actors._staged import retire_soon
from ashd.actors._warmer import Warmer
from ashd.devtools.fake_model import FakeModel
from ashd.errors import NotFound, ServiceError
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.sandboxing._types import SandboxLimits, SandboxPaths, SandboxSpec
from ashd.storage import Database
from ashd.storage._agents import AgentView
from ashd.storage._credentials import Credentials
from ashd.storage._crypto import Cipher
from ashd.storage._models import Agent, Session, iso, new_id
from ashd.storage._session_logs import SessionLogs
from ashd.storage._sessions import Sessions, session_json
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.plain_launcher import PlainLauncher
from tests.fixtures.sandboxes import wait_for

T = 30.0
TENANT = "acme"
KEY = bytes(range(32))


class StallingSessions(Sessions):
    """Real storage where chosen calls for chosen sessions wait at a gate: a database that stalls."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.gates: dict[tuple[str, str], asyncio.Event] = {}
        self.stalled: dict[str, asyncio.Event] = {}  # set once a call for the session waits at its gate

    def stall(self, sid: str, call: str = "transition") -> asyncio.Event:
        """Hold the session's `call`s (transition, insert, all_message_contents, update_config after
        its write) until the returned gate is set."""
        self.stalled[sid] = asyncio.Event()
        self.gates[(sid, call)] = asyncio.Event()
        return self.gates[(sid, call)]

    async def _gate(self, sid: str, call: str) -> None:
        gate = self.gates.get((sid, call))
        if gate is not None:
            self.stalled[sid].set()
            await gate.wait()

    async def transition(self, session_id: str, *args: Any, **kwargs: Any) -> Session:
        await self._gate(session_id, "transition")
        return await super().transition(session_id, *args, **kwargs)

    async def insert(self, row: Session) -> Session:
        await self._gate(row.id, "insert")
        return await super().insert(row)

    def insert_soon(self, row: Session) -> Any:
        if (row.id, "insert") in self.gates:  # a stalled insert waits on the loop, as on PostgreSQL
            return self.insert(row)
        return super().insert_soon(row)

    def transition_soon(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        # A stalled session's transition waits on the loop; the others take the writer thread as in
        # the server, so both ways the actor can be told an outcome are exercised.
        if (session_id, "transition") in self.gates:
            return self.transition(session_id, *args, **kwargs)
        return super().transition_soon(session_id, *args, **kwargs)

    async def all_message_contents(self, session_id: str) -> list[dict[str, Any]]:
        await self._gate(session_id, "all_message_contents")
        return await super().all_message_contents(session_id)

    async def update_config(self, session_id: str, *args: Any) -> Session:
        # Held after the write: the row it answers is already stored when the gate opens.
        row = await super().update_config(session_id, *args)
        await self._gate(session_id, "update_config")
        return row


class StallingLogs(SessionLogs):
    """Real log storage whose writes can be held at a gate: a log store that stalls."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.gate: asyncio.Event | None = None

    def stall(self) -> asyncio.Event:
        self.gate = asyncio.Event()
        return self.gate

    async def add(self, *args: Any, **kwargs: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await super().add(*args, **kwargs)


class RecordingWarmer(Warmer):
    """The server's Warmer, noting which spares the pool asked it to prepare."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.prepared: list[str] = []

    def prepare(self, sandbox_id: str, paths: SandboxPaths, *args: Any) -> None:
        self.prepared.append(sandbox_id)
        super().prepare(sandbox_id, paths, *args)


@dataclass
class Machine:
    """SessionDeps over real storage and a real pool; `actor(sid)` starts a SessionActor."""

    sessions: StallingSessions
    pool: Any  # PoolActor proxy
    launcher: PlainLauncher
    agents: dict[str, AgentView]
    credentials: Credentials
    warmer: RecordingWarmer
    deps: SessionDeps | None = None
    snapshots: Any = None  # SnapshotProxy, or None: no snapshots
    model_proxy: ModelProxy | None = None
    logs: StallingLogs | None = None  # where LogTails stores the sessions' logs
    actors: dict[str, Any] = field(default_factory=dict)
    resumes: list[tuple[str, str]] = field(default_factory=list)
    # on_status calls: (tenant, session id, agent, from, to, action, extra)
    statuses: list[tuple[Any, ...]] = field(default_factory=list)
    listener_fails: bool = False  # on_status raises (after recording)

    def actor(self, sid: str) -> Any:
        assert self.deps is not None
        if sid not in self.actors:
            self.actors[sid] = SessionActor.start(self.deps, sid, TENANT)
        return self.actors[sid].proxy()

    async def ask(self, sid: str, method: str, *args: Any) -> Any:
        return await call(getattr(self.actor(sid), method)(*args), 2 * T)

    async def refused(self, sid: str, method: str, *args: Any) -> ServiceError:
        with pytest.raises(ServiceError) as refused:
            await self.ask(sid, method, *args)
        return refused.value

    async def insert(self, status: str, error: str | None = None, agent: str = "helper") -> str:
        sid = new_id()
        await self.sessions.insert(Session(id=sid, tenant_id=TENANT, agent_name=agent, status=status, model=None,
                                           config="{}", error=error))
        return sid

    async def create(self, agent: str = "helper", env: bytes | None = None, *, extra_env: dict[str, str] | None = None,
                     config: dict[str, Any] | None = None, credential_id: str | None = None,
                     model: str | None = None, sid: str | None = None) -> tuple[str, dict[str, Any]]:
        sid = sid or new_id()
        if extra_env is not None:
            env = Cipher(KEY).encrypt_json(extra_env, sid.encode())
        row = Session(id=sid, tenant_id=TENANT, agent_name=agent, model=model, status="starting",
                      config=json.dumps(config or {}), env_ciphertext=env, credential_id=credential_id,
                      runner_id=self.deps.runner_id if self.deps is not None else None)
        inserting = asyncio.ensure_future(self.sessions.insert(row))  # as the registry: beside the start
        req = CreateRequest(sid, TENANT, agent, None, {}, agent=self.agents[agent])
        try:
            view: dict[str, Any] = await call(self.actor(sid).create(req, row, outcome_of(inserting)), 2 * T)
        finally:
            await asyncio.wait([inserting])
        return sid, view

    async def row(self, sid: str) -> Session:
        return await self.sessions.get(TENANT, sid)

    async def lifecycle(self, sid: str) -> list[str]:
        return [e["action"] for e in await self.lifecycle_events(sid)]

    async def lifecycle_events(self, sid: str) -> list[dict[str, Any]]:
        events = await self.sessions.events(TENANT, sid, 0, 100, "lifecycle")
        return [json.loads(e["data"]) for e in events]

    async def run(self, sid: str, *argv: str) -> str:
        """Run a command in the session's sandbox through the bridge (POST .../exec): its stdout."""
        conn = await self.ask(sid, "begin_exec")
        try:
            result = await conn.exec(list(argv), timeout=T)
        finally:
            await self.ask(sid, "end_exec")
        assert result.get("exitCode") == 0, result
        return str(result.get("stdout"))

    def counts(self) -> dict[str, int]:
        stats: dict[str, int] = self.pool.stats().get(timeout=T)
        return {k: stats[k] for k in ("warming", "warm", "waiting", "running") if stats[k]}


@contextlib.asynccontextmanager
async def open_machine(short_tmp: Path, *, snapshot_max_bytes: int | None = None, snapshots: bool = False,
                       activity: Activity | None = None,
                       runner_id: str | None = None, model_url: str | None = None,
                       logs: bool = False, prewarm: int = 0, setup_timeout: float = T,
                       disk_quota: bool = False) -> AsyncIterator[Machine]:
    """The Machine over fresh storage and a fresh pool. `snapshots`: a real SnapshotActor in the
    data dir (`snapshot_max_bytes` its limit); `runner_id`: the actors run as that runner's;
    `model_url`: a real ModelProxy in front of that model; `logs`: the sessions' logs kept (LogTails,
    no sweep: a sandbox's lines are stored when it goes); `prewarm`: that many spares kept warm, their
    bridge connections made ahead by the server's Warmer (present either way, as in the server);
    `disk_quota`: sandboxes get the disk size they ask for (else any serves any, as without images)."""
    db = await Database.open(f"sqlite+aiosqlite:///{short_tmp / 'ashd.db'}")
    launcher = PlainLauncher(short_tmp / "sb", bridge=True, disk_quota=disk_quota)
    agent_dir = short_tmp / "agent"
    agent_dir.mkdir()
    (agent_dir / "AGENT.md").write_text("You are helpful.\n")
    agents = {
        "helper": AgentView("a1", "helper", 1, str(agent_dir), None, {}, False),
    }

    async with db.tx() as s:  # a warm resume checks its agent in the agents table, in its transition
        s.add(Agent(id="a1", tenant_id=TENANT, name="helper", path=str(agent_dir)))
    cipher = Cipher(KEY)

    def decrypt_env(blob: bytes | None, sid: str) -> dict[str, str]:
        return dict(cipher.decrypt_json(blob, sid.encode())) if blob else {}

    def spec_for(sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id, launcher.paths_for(sandbox_id), network=network)

    lost: list[SandboxLost] = []
    model_proxy = ModelProxy(model_url) if model_url is not None else None
    warmer = RecordingWarmer(asyncio.get_running_loop(), model_proxy, T)
    pool_ref = PoolActor.start(PoolConfig(max_capacity=3, prewarm=prewarm, idle_timeout=3600.0, shutdown_grace=1.0),
                               launcher, spec_for, None, lost.append, warmer)
    snapshot_ref = (SnapshotActor.start(short_tmp / "snapshots", max_bytes=snapshot_max_bytes,
                                        owed=OwedSnapshots(activity))
                    if snapshots or snapshot_max_bytes is not None else None)
    m = Machine(StallingSessions(db), pool_ref.proxy(), launcher, agents, Credentials(db, cipher), warmer,
                snapshots=snapshot_proxy(snapshot_ref) if snapshot_ref is not None else None,
                model_proxy=model_proxy,
                logs=StallingLogs(db) if logs else None)
    tails = LogTails(m.logs, interval=3600) if m.logs is not None else None

    async def resolve_agent(_tenant: str, name: str) -> AgentView:
        if name not in agents:
            raise NotFound(f"Agent {name} not found")
        return agents[name]

    def on_status(*change: Any) -> None:
        m.statuses.append(change)
        if m.listener_fails:
            raise RuntimeError("the webhook queue is broken")

    m.deps = SessionDeps(
        loop=asyncio.get_running_loop(), sessions=m.sessions, pool=m.pool, snapshots=m.snapshots, model_proxy=m.model_proxy,
        resolve_agent=resolve_agent, resolve_credential=m.credentials.use,
        decrypt_env=decrypt_env, count_resume=lambda path, sid, _agent: m.resumes.append((path, sid)),
        fallback_api_key=None, ask_timeout=T, setup_timeout=setup_timeout, shutdown_grace=1.0,
        network_default=False, sandbox_owner=lambda _sid: None, runner_id=runner_id, on_status=on_status,
        session_logs=tails, warmer=warmer, snapshot_max_bytes=snapshot_max_bytes)
    try:
        yield m
    finally:
        for ref in m.actors.values():
            if ref.is_alive():
                ref.stop(block=False)
        await asyncio.to_thread(lambda: pool_ref.stop(block=True, timeout=60))
        await warmer.close()
        if snapshot_ref is not None:
            await asyncio.to_thread(lambda: snapshot_ref.stop(block=True, timeout=60))
        if m.model_proxy is not None:
            await m.model_proxy.close()
        if tails is not None:
            await tails.close()
        launcher.kill_all()
        await db.close()


@pytest.fixture
async def machine(short_tmp: Path) -> AsyncIterator[Machine]:
    async with open_machine(short_tmp) as m:
        yield m


# --- rejections: the exact status of each refused row -------------------------------------------

# (message, status the session is in) -> the status code the API answers
REFUSED = {
    ("pause", "starting"): 400, ("pause", "paused"): 400, ("pause", "stopped"): 400,
    ("pause", "error"): 400, ("pause", "ended"): 400,
    ("stop_session", "paused"): 400, ("stop_session", "stopped"): 400, ("stop_session", "error"): 400,
    ("stop_session", "ended"): 400,
    ("resume", "ended"): 410,
    ("begin_turn", "starting"): 400, ("begin_turn", "paused"): 400, ("begin_turn", "stopped"): 400,
    ("begin_turn", "error"): 400, ("begin_turn", "ended"): 400,
    ("interrupt", "active"): 409, ("interrupt", "paused"): 409,
}


# what an ended session's refusals say: where to go instead
MESSAGES = {
    ("begin_turn", "ended"): "Session is ended; create a new session",
    ("begin_turn", "paused"): "Session is paused; resume it before sending messages",
    ("resume", "ended"): "Session has ended; create a new session",
    ("stop_session", "paused"): "Session is paused; only an active or starting session can be stopped",
}


async def test_every_refused_transition_has_its_status_and_changes_nothing(machine: Machine) -> None:
    for (message, status), code in REFUSED.items():
        sid = await machine.insert(status, error="boom" if status == "error" else None)
        args: tuple[Any, ...] = ("hello", None) if message == "begin_turn" else ()
        refused = await machine.refused(sid, message, *args)
        assert refused.status_code == code, (message, status, refused.message)
        if (message, status) in MESSAGES:
            assert refused.message == MESSAGES[message, status]
        row = await machine.row(sid)
        assert (row.status, row.error) == (status, "boom" if status == "error" else None), (message, status)
        assert await machine.lifecycle(sid) == [], (message, status)
    assert machine.counts() == {}  # no refusal claimed a sandbox


async def test_delete_of_an_ended_session_answers_as_is(machine: Machine) -> None:
    sid = await machine.insert("ended")
    view = await machine.ask(sid, "delete")
    assert view["status"] == "ended"
    assert await machine.lifecycle(sid) == []


# --- accepted transitions -----------------------------------------------------------------------

async def test_create_pause_resume_stop(machine: Machine) -> None:
    sid, view = await machine.create()
    assert view["status"] == "active" and view["sandboxId"]
    assert machine.counts() == {"waiting": 1}  # configured: the pool may now sweep or evict it
    assert (await machine.row(sid)).sandbox_id == view["sandboxId"]

    assert (await machine.ask(sid, "resume"))["status"] == "active"  # active: a no-op
    assert (await machine.ask(sid, "pause"))["status"] == "paused"
    resumed = await machine.ask(sid, "resume")
    assert resumed["status"] == "active" and resumed["sandboxId"] == view["sandboxId"]  # warm
    assert machine.resumes == [("warm", sid)]

    stopped = await machine.ask(sid, "stop_session")
    assert stopped["status"] == "stopped" and (await machine.row(sid)).sandbox_id == ""
    assert machine.counts() == {}  # the sandbox went with the stop
    assert await machine.ask(sid, "retirable") is True
    resumed = await machine.ask(sid, "resume")  # stopped → cold resume on a new sandbox
    assert resumed["status"] == "active" and resumed["sandboxId"] not in ("", view["sandboxId"])
    assert machine.resumes[-1] == ("cold", sid)
    assert await machine.lifecycle(sid) == ["created", "paused", "resumed", "stopped", "resumed"]


async def test_a_warm_resume_whose_agent_is_gone_is_404_and_changes_nothing(machine: Machine) -> None:
    sid, view = await machine.create()
    await machine.ask(sid, "pause")
    async with machine.sessions.db.tx() as s:
        await s.execute(delete(Agent).where(Agent.name == "helper"))
    refused = await machine.refused(sid, "resume")
    assert (refused.status_code, refused.message) == (404, "Agent helper not found")
    assert (await machine.row(sid)).status == "paused"
    assert await machine.lifecycle(sid) == ["created", "paused"]
    assert machine.resumes == []
    async with machine.sessions.db.tx() as s:  # deployed again: the kept sandbox resumes warm
        s.add(Agent(id="a1", tenant_id=TENANT, name="helper", path="/elsewhere"))
    resumed = await machine.ask(sid, "resume")
    assert (resumed["status"], resumed["sandboxId"]) == ("active", view["sandboxId"])
    assert machine.resumes == [("warm", sid)]


async def test_stop_of_a_session_still_starting(machine: Machine) -> None:
    sid = await machine.insert("starting")
    assert (await machine.ask(sid, "stop_session"))["status"] == "stopped"


async def test_resume_from_error_clears_the_error(machine: Machine) -> None:
    sid = await machine.insert("error", error="sandbox creation failed")
    view = await machine.ask(sid, "resume")
    assert view["status"] == "active" and "error" not in view
    row = await machine.row(sid)
    assert (row.status, row.error) == ("active", None)


async def test_a_cold_resume_failure_of_any_kind_is_a_500_that_points_at_the_log(machine: Machine) -> None:
    sid = new_id()  # its environment encrypted under another key: the cipher's own exception
    foreign = Cipher(bytes(32)).encrypt_json({"TOKEN": "x"}, sid.encode())
    await machine.sessions.insert(Session(id=sid, tenant_id=TENANT, agent_name="helper", status="stopped", model=None,
                                          config="{}", env_ciphertext=foreign))
    refused = await machine.refused(sid, "resume")
    assert refused.status_code == 500
    assert refused.message.startswith("A new sandbox could not be created for cold resume (")
    assert refused.message.endswith("the details are in the server log")
    assert (await machine.row(sid)).status == "stopped"


async def test_a_creation_failure_of_any_kind_leaves_the_session_in_error(machine: Machine) -> None:
    # The session's environment was encrypted under another key (the server's key was replaced):
    # decrypting it fails with the cipher's own exception, not a ServiceError.
    foreign = Cipher(bytes(32)).encrypt_json({"TOKEN": "x"}, b"whatever")
    with pytest.raises(ServiceError) as failed:
        await machine.create(env=foreign)
    assert failed.value.status_code == 500
    [view] = await machine.sessions.list_views(TENANT, "helper")
    assert view["status"] == "error" and view["error"] is not None
    assert failed.value.message.startswith("Sandbox creation failed") and "server log" in view["error"]
    assert await machine.lifecycle(view["id"]) == ["error"]
    assert machine.counts() == {}  # nothing was claimed


async def test_a_create_whose_insert_fails_stores_nothing_and_lets_its_sandbox_go(machine: Machine) -> None:
    """The row's insert runs beside the sandbox's start: when it fails (here the session id is
    taken), its error is the answer, nothing more is stored, and the started sandbox is let go."""
    taken = await machine.insert("paused")
    row = Session(id=taken, tenant_id=TENANT, agent_name="helper", model=None, status="starting", config="{}")
    req = CreateRequest(taken, TENANT, "helper", None, {}, agent=machine.agents["helper"])
    with pytest.raises(Exception, match="UNIQUE|unique|duplicate"):
        await call(machine.actor(taken).create(req, row, outcome_of(asyncio.ensure_future(machine.sessions.insert(row)))),
                   2 * T)
    assert (await machine.row(taken)).status == "paused"  # the session that held the id is untouched
    assert await machine.lifecycle(taken) == []
    wait_for(lambda: machine.counts() == {}, T, "the sandbox started for it released")


async def test_a_registry_create_whose_insert_fails_answers_its_error_and_starts_nothing(short_tmp: Path) -> None:
    """Through the registry, on SQLite, the row is inserted on the loop's thread before anything
    starts: an insert that fails (the id is taken) is the answer, with no actor and no sandbox."""
    async with open_machine(short_tmp, prewarm=1) as m:
        assert m.deps is not None
        await until(lambda: m.counts() == {"warm": 1}, "the spare warm")
        registry = SessionRegistry(m.deps)
        try:
            taken = await m.insert("paused")
            with pytest.raises(Exception, match="UNIQUE|unique|duplicate"):
                await registry.create(CreateRequest(taken, TENANT, "helper", None, {}, agent=m.agents["helper"]),
                                      encrypted_env=None)
            assert registry.live_actors() == 0
            assert m.pool.stats().get(timeout=T)["preWarmHits"] == 0  # the spare was not taken
            assert m.counts() == {"warm": 1}
            assert (await m.row(taken)).status == "paused" and await m.lifecycle(taken) == []
        finally:
            await registry.stop_all()


async def test_a_registry_create_whose_insert_waits_starts_its_sandbox_beside_it(machine: Machine) -> None:
    """An insert that cannot run at once (here held; a busy SQLite, PostgreSQL) is awaited beside the
    sandbox's start, and the creation answers once both are done."""
    assert machine.deps is not None
    registry = SessionRegistry(machine.deps)
    try:
        sid = new_id()
        gate = machine.sessions.stall(sid, "insert")
        creating = asyncio.ensure_future(registry.create(
            CreateRequest(sid, TENANT, "helper", None, {}, agent=machine.agents["helper"]), encrypted_env=None))
        await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)
        await until(lambda: sum(machine.counts().values()) == 1, "the sandbox claimed while the row waits")
        assert not creating.done()
        gate.set()
        view = await asyncio.wait_for(creating, T)
        assert view["status"] == "active" and (await machine.row(sid)).status == "active"
    finally:
        await registry.stop_all()


async def test_a_failed_start_releases_its_sandbox(machine: Machine) -> None:
    (machine.launcher.root / "agent-gone").mkdir(parents=True)
    machine.agents["gone"] = AgentView("a2", "gone", 1, str(machine.launcher.root / "agent-gone"), None, {}, False)
    with pytest.raises(ServiceError) as failed:  # no AGENT.md: the copy into the workspace refuses
        await machine.create("gone")
    assert failed.value.status_code == 500 and "AGENT.md" in failed.value.message
    [row] = await machine.sessions.list_views(TENANT, "gone")
    assert (row["status"], row["error"]) == ("error", failed.value.message)
    wait_for(lambda: machine.counts() == {}, T, "the failed session's sandbox released")


async def test_a_session_on_a_warm_spare_uses_the_connection_made_ahead(short_tmp: Path) -> None:
    async with open_machine(short_tmp, prewarm=1) as m:
        await until(lambda: m.warmer.prepared != [], "the spare prepared")
        sid, view = await m.create()
        assert (view["status"], view["sandboxId"]) == ("active", m.warmer.prepared[0])
        assert await m.run(sid, "echo", "on the spare") == "on the spare\n"


async def test_a_failed_start_on_a_warm_spare_lets_its_prepared_connection_go(short_tmp: Path) -> None:
    """A preparation nobody took is closed: a start that fails before its bridge's init (here the
    agent folder) would otherwise leave the spare's connection open for good."""
    async with open_machine(short_tmp, prewarm=1) as m:
        (short_tmp / "agent-gone").mkdir()
        m.agents["gone"] = AgentView("a2", "gone", 1, str(short_tmp / "agent-gone"), None, {}, False)
        await until(lambda: m.warmer.prepared != [], "the spare prepared")
        spare = m.warmer.prepared[0]
        with pytest.raises(ServiceError) as failed:  # no AGENT.md: the copy into the workspace refuses
            await m.create("gone")
        assert failed.value.status_code == 500
        # The discard was told to the loop before the failure was answered.
        assert m.warmer.take(spare) is None


async def test_a_setup_that_runs_past_the_setup_timeout_is_cut_off_with_the_setup_error(short_tmp: Path) -> None:
    """SERVICE_SETUP_TIMEOUT_SECONDS is setup.sh's: the bridge kills it then and the creation fails
    saying so. The session waits longer than that for the init (`SessionDeps.init_timeout`), so
    that the answer is the setup's error, not a timeout of its own."""
    async with open_machine(short_tmp, setup_timeout=3) as m:
        (Path(m.agents["helper"].path) / "setup.sh").write_text("echo installing; sleep 60\n")
        with pytest.raises(ServiceError) as failed:
            await m.create()
        assert "setup.sh timed out after 3s" in failed.value.message
        [row] = await m.sessions.list_views(TENANT, "helper")
        assert (row["status"], row["error"]) == ("error", failed.value.message)


async def until(condition: Any, what: str) -> None:
    """Wait for a condition that work on this loop makes true (wait_for would block the loop)."""
    try:
        async with asyncio.timeout(T):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_turn_blocks_a_second_turn_and_a_pause_waits_for_its_end(machine: Machine) -> None:
    sid, _ = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    assert machine.counts() == {"running": 1}
    assert (await machine.refused(sid, "begin_turn", "again", None)).status_code == 409
    # An active session pauses (decisions.md): the turn is interrupted, and the pause happens, and
    # is answered, once the turn has ended (stored). The actor handles other messages meanwhile.
    pausing = asyncio.ensure_future(machine.ask(sid, "pause"))
    await asyncio.sleep(0.2)
    assert not pausing.done() and (await machine.row(sid)).status == "active"
    assert await machine.ask(sid, "running_turn") == ticket.query_id
    await machine.ask(sid, "end_turn", "q-not-this-one")  # a stale end changes nothing
    assert await machine.ask(sid, "running_turn") == ticket.query_id and not pausing.done()
    await machine.ask(sid, "end_turn", ticket.query_id)
    assert (await pausing)["status"] == "paused"
    assert (await machine.row(sid)).status == "paused"


async def test_a_stop_during_a_turn_waits_for_its_end_and_a_pause_waiting_too_is_refused(machine: Machine) -> None:
    sid, _ = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    pausing = asyncio.ensure_future(machine.ask(sid, "pause"))
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(machine.ask(sid, "stop_session"))
    await asyncio.sleep(0.2)
    # Both wait for the interrupted turn's end (stored); the session is as it was meanwhile.
    assert not pausing.done() and not stopping.done()
    assert (await machine.row(sid)).status == "active"
    await machine.ask(sid, "end_turn", ticket.query_id)
    assert (await asyncio.wait_for(stopping, T))["status"] == "stopped"  # the stop wins, though it came second
    with pytest.raises(ServiceError) as refused:
        async with asyncio.timeout(T):
            await pausing
    assert (refused.value.status_code, refused.value.message) == (
        400, "Session is stopped; only an active session can be paused")
    assert await machine.lifecycle(sid) == ["created", "stopped"]


async def test_a_stop_or_a_delete_snapshots_what_the_interrupted_turn_wrote_until_its_end(short_tmp: Path) -> None:
    # A stop that snapshotted at once, then let the sandbox go under the turn, missed what the
    # turn's tools wrote in between. Here the write comes after the stop was asked for.
    async with open_machine(short_tmp, snapshots=True) as machine:
        for ending in ("stop_session", "delete"):
            sid, view = await machine.create()
            ticket = await machine.ask(sid, "begin_turn", "hello", None)
            asked = asyncio.ensure_future(machine.ask(sid, ending))
            await asyncio.sleep(0.2)
            assert not asked.done()
            workspace = machine.launcher.paths_for(view["sandboxId"]).workspace
            (workspace / "late.txt").write_text("written while the turn ended")
            await machine.ask(sid, "end_turn", ticket.query_id)
            assert (await asyncio.wait_for(asked, T))["status"] in ("stopped", "ended")
            snapshotted = functools.partial(lambda sid: machine.snapshots.latest(sid).get(timeout=T) is not None, sid)
            wait_for(snapshotted, T, "the final snapshot")
            reader = machine.snapshots.reader(sid).get(timeout=T)
            assert "late.txt" in {f.path for f in reader.list_files()}, ending
        wait_for(lambda: machine.counts() == {}, T, "both sandboxes released")


async def test_a_stop_does_not_wait_longer_than_the_grace_for_a_turn_that_does_not_end(machine: Machine) -> None:
    sid, _ = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    stopping = asyncio.ensure_future(machine.ask(sid, "stop_session"))
    await asyncio.sleep(0.3)
    assert not stopping.done()  # the turn is not told to end here: the grace (1 s) runs out
    assert (await asyncio.wait_for(stopping, T))["status"] == "stopped"
    assert (await machine.row(sid)).status == "stopped"
    await machine.ask(sid, "end_turn", ticket.query_id)  # the cut-short turn's end, stored late, changes nothing
    assert await machine.lifecycle(sid) == ["created", "stopped"]
    assert await machine.ask(sid, "retirable") is True


async def test_a_lost_sandbox_pauses_an_idle_session_and_not_a_turn(machine: Machine) -> None:
    idle, view = await machine.create()
    busy, busy_view = await machine.create()
    await machine.ask(busy, "begin_turn", "hello", None)
    await machine.ask(idle, "sandbox_lost", SandboxLost(idle, "sb-other", LossReason.IDLE, "idle timeout"))
    assert (await machine.row(idle)).status == "active"  # another sandbox's loss: not this session's
    await machine.ask(idle, "sandbox_lost", SandboxLost(idle, view["sandboxId"], LossReason.IDLE, "idle timeout"))
    assert (await machine.row(idle)).status == "paused"
    await machine.ask(busy, "sandbox_lost",
                      SandboxLost(busy, busy_view["sandboxId"], LossReason.EXITED, "killed by signal 9"))
    assert (await machine.row(busy)).status == "active"  # the turn reports the crash itself
    assert await machine.ask(busy, "retirable") is False  # the turn still holds it


async def test_a_dead_sandbox_is_replaced_at_the_next_turn(machine: Machine) -> None:
    sid, view = await machine.create()
    machine.launcher.procs[view["sandboxId"]].popen.kill()
    wait_for(lambda: not machine.pool.is_alive(view["sandboxId"]).get(timeout=T), T, "the sandbox dead")
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    assert ticket.sandbox_id != view["sandboxId"]
    assert machine.launcher.procs[ticket.sandbox_id].poll() is None


# --- no actor thread blocks on the loop; one session's transitions stay serialised ---------------

async def test_a_stalled_database_blocks_neither_the_actor_nor_other_sessions(machine: Machine) -> None:
    a, view = await machine.create()
    b, _ = await machine.create()
    gate = machine.sessions.stall(a)
    pausing = asyncio.ensure_future(machine.ask(a, "pause"))
    await asyncio.wait_for(machine.sessions.stalled[a].wait(), T)  # a's pause waits in the database
    # a's actor still answers at once, from the state its last finished transition left...
    assert await call(machine.actor(a).running_turn(), 2) is None
    assert await call(machine.actor(a).workspace(), 2) == machine.launcher.paths_for(view["sandboxId"]).workspace
    # ...a second transition of a waits for the first and is decided on its outcome...
    stopping = asyncio.ensure_future(machine.ask(a, "stop_session"))
    # ...and the other session's transitions go through meanwhile.
    assert (await call(machine.actor(b).pause(), 5))["status"] == "paused"
    assert (await call(machine.actor(b).resume(), 5))["status"] == "active"
    assert not pausing.done() and not stopping.done()
    assert (await machine.row(a)).status == "active"
    gate.set()
    assert (await pausing)["status"] == "paused"
    with pytest.raises(ServiceError) as refused:  # the stop is decided on the paused session
        await stopping
    assert refused.value.status_code == 400 and "paused" in refused.value.message
    assert await machine.lifecycle(a) == ["created", "paused"]
    assert await machine.ask(a, "retirable") is False  # paused: it keeps its sandbox
    assert await machine.lifecycle(b) == ["created", "paused", "resumed"]


async def test_a_double_resume_has_one_transition(machine: Machine) -> None:
    sid, view = await machine.create()
    await machine.ask(sid, "pause")
    gate = machine.sessions.stall(sid)
    first = asyncio.ensure_future(machine.ask(sid, "resume"))
    await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)
    second = asyncio.ensure_future(machine.ask(sid, "resume"))
    await asyncio.sleep(0.1)
    assert not first.done() and not second.done()
    gate.set()
    answers = [await first, await second]
    assert [v["status"] for v in answers] == ["active", "active"]
    assert {v["sandboxId"] for v in answers} == {view["sandboxId"]}
    assert machine.resumes == [("warm", sid)]  # the second found the session active: a no-op
    assert await machine.lifecycle(sid) == ["created", "paused", "resumed"]


async def test_a_delete_during_create_ends_the_created_session(machine: Machine) -> None:
    sid = new_id()
    row = Session(id=sid, tenant_id=TENANT, agent_name="helper", model=None, status="starting", config="{}")
    inserted = await machine.sessions.insert(row)
    gate = machine.sessions.stall(sid)
    creating = asyncio.ensure_future(call(machine.actor(sid).create(
        CreateRequest(sid, TENANT, "helper", None, {}, agent=machine.agents["helper"]), row,
        outcome_of(asyncio.ensure_future(asyncio.sleep(0, inserted)))), 2 * T))
    await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)  # configured; storing `active`
    deleting = asyncio.ensure_future(machine.ask(sid, "delete"))
    await asyncio.sleep(0.1)
    assert not deleting.done()
    gate.set()
    assert (await creating)["status"] == "active"
    assert (await deleting)["status"] == "ended"
    assert await machine.lifecycle(sid) == ["created", "ended"]
    wait_for(lambda: machine.counts() == {}, T, "the ended session's sandbox released")


async def test_two_pauses_during_a_turn_wait_for_its_end_and_pause_once(machine: Machine) -> None:
    sid, _ = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    pauses = [asyncio.ensure_future(machine.ask(sid, "pause")) for _ in range(2)]
    await asyncio.sleep(0.2)
    assert not any(p.done() for p in pauses)
    await machine.ask(sid, "end_turn", ticket.query_id)
    assert [(await p)["status"] for p in pauses] == ["paused", "paused"]
    assert await machine.lifecycle(sid) == ["created", "paused"]


async def test_an_actor_stopped_while_starting_a_sandbox_lets_it_go(machine: Machine) -> None:
    sid, _ = await machine.create()
    await machine.ask(sid, "stop_session")
    gate = machine.sessions.stall(sid, "all_message_contents")
    resuming = asyncio.ensure_future(machine.ask(sid, "resume"))  # cold: a new sandbox, then the history
    await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)
    assert sum(machine.counts().values()) == 1  # claimed for the resume
    machine.actors[sid].stop(block=False)
    with pytest.raises(ServiceError) as refused:  # at once, and nothing is half-held
        await asyncio.wait_for(resuming, 5)
    assert refused.value.status_code == 503
    wait_for(lambda: machine.counts() == {}, T, "the claimed sandbox released")
    assert (await machine.row(sid)).status == "stopped"
    gate.set()  # the stalled read ends; its outcome has no one to go to


async def test_a_pause_waiting_for_a_turn_is_answered_when_the_actor_stops(machine: Machine) -> None:
    sid, _ = await machine.create()
    await machine.ask(sid, "begin_turn", "hello", None)
    pausing = asyncio.ensure_future(machine.ask(sid, "pause"))
    await asyncio.sleep(0.2)
    assert not pausing.done()
    machine.actors[sid].stop(block=False)
    with pytest.raises(ServiceError) as refused:  # at once, not at the caller's timeout
        await asyncio.wait_for(pausing, 5)
    assert refused.value.status_code == 503


# --- resume paths, setup and snapshots -----------------------------------------------------------

async def test_a_resume_records_its_path_and_only_a_cold_one_says_whether_the_workspace_came_back(
        machine: Machine) -> None:
    sid, _ = await machine.create()
    await machine.ask(sid, "pause")
    warm = await machine.ask(sid, "resume")
    assert "workspaceRestored" not in warm
    await machine.ask(sid, "stop_session")
    cold = await machine.ask(sid, "resume")
    assert cold["workspaceRestored"] is False  # no snapshots here: a fresh agent folder
    resumed = [e for e in await machine.lifecycle_events(sid) if e["action"] == "resumed"]
    assert [{k: v for k, v in e.items() if k not in ("action", "ts")} for e in resumed] == [
        {"status": "active", "path": "warm"}, {"status": "active", "path": "cold", "workspaceRestored": False}]


async def test_a_restored_workspace_keeps_its_files_and_does_not_run_setup_again(short_tmp: Path) -> None:
    async with open_machine(short_tmp, snapshots=True) as machine:
        (Path(machine.agents["helper"].path) / "setup.sh").write_text("echo ran >> setup-runs.txt\n")
        sid, _ = await machine.create()
        assert await machine.run(sid, "cat", "setup-runs.txt") == "ran\n"
        await machine.run(sid, "sh", "-c", "echo kept > notes.txt")
        assert (await machine.ask(sid, "stop_session"))["status"] == "stopped"  # snapshots the workspace
        resumed = await machine.ask(sid, "resume")
        assert resumed["workspaceRestored"] is True
        assert (await machine.lifecycle_events(sid))[-1]["workspaceRestored"] is True
        assert await machine.run(sid, "cat", "notes.txt") == "kept\n"
        assert await machine.run(sid, "cat", "setup-runs.txt") == "ran\n"  # setup ran once, at creation


async def test_a_pause_snapshots_the_workspace(short_tmp: Path) -> None:
    async with open_machine(short_tmp, snapshots=True) as machine:
        sid, _ = await machine.create()
        await machine.run(sid, "sh", "-c", "echo paused-work > notes.txt")
        assert machine.snapshots.latest(sid).get(timeout=T) is None
        assert (await machine.ask(sid, "pause"))["status"] == "paused"
        wait_for(lambda: machine.snapshots.latest(sid).get(timeout=T) is not None, T, "the pause's snapshot")
        reader = machine.snapshots.reader(sid).get(timeout=T)
        assert "notes.txt" in {f.path for f in reader.list_files()}


async def test_a_fork_starts_from_its_snapshot_of_the_parent_workspace(short_tmp: Path) -> None:
    async with open_machine(short_tmp, snapshots=True) as machine:
        (Path(machine.agents["helper"].path) / "setup.sh").write_text("echo ran >> setup-runs.txt\n")
        parent, _ = await machine.create()
        await machine.run(parent, "sh", "-c", "echo parent-work > notes.txt")
        child = new_id()  # as the registry forks: the live workspace snapshotted as the child's, the row
        workspace = await machine.ask(parent, "workspace")
        machine.snapshots.snapshot(child, workspace).get(timeout=T)
        row = await machine.sessions.insert_fork(
            Session(id=child, tenant_id=TENANT, agent_name="helper", model=None, status="starting", config="{}"),
            parent)
        view = await call(machine.actor(child).start_fork(row), 2 * T)
        assert (view["status"], view["parentSessionId"]) == ("active", parent)
        assert (await machine.lifecycle_events(child))[-1] == {
            "action": "forked", "status": "active", "parentSessionId": parent}
        assert await machine.run(child, "cat", "notes.txt") == "parent-work\n"
        assert await machine.run(child, "cat", "setup-runs.txt") == "ran\n"  # the parent's setup, not again


async def test_a_fresh_agent_folder_runs_setup_again_on_a_cold_resume(machine: Machine) -> None:
    (Path(machine.agents["helper"].path) / "setup.sh").write_text("echo ran >> setup-runs.txt\n")
    sid, _ = await machine.create()
    await machine.run(sid, "sh", "-c", "echo lost > notes.txt")
    await machine.ask(sid, "stop_session")
    assert (await machine.ask(sid, "resume"))["workspaceRestored"] is False
    assert await machine.run(sid, "cat", "setup-runs.txt") == "ran\n"
    assert await machine.run(sid, "ls") == "AGENT.md\nsetup-runs.txt\nsetup.sh\n"


async def test_a_workspace_over_the_snapshot_limit_refuses_a_stop_but_not_a_delete(short_tmp: Path) -> None:
    async with open_machine(short_tmp, snapshot_max_bytes=64 * 1024) as machine:
        sid, view = await machine.create()
        await machine.run(sid, "sh", "-c", "head -c 200000 /dev/zero > big.bin")
        refused = await machine.refused(sid, "stop_session")
        assert refused.status_code == 413, refused.message
        row = await machine.row(sid)  # nothing lost: the session keeps its sandbox and workspace
        assert (row.status, row.sandbox_id) == ("active", view["sandboxId"])
        assert await machine.run(sid, "wc", "-c", "big.bin") == "200000 big.bin\n"
        ended = await machine.ask(sid, "delete")
        assert ended["status"] == "ended"
        last = (await machine.lifecycle_events(sid))[-1]
        assert last["action"] == "ended" and last["snapshot"] == refused.message
        wait_for(lambda: machine.counts() == {}, T, "the ended session's sandbox released")


async def test_a_delete_answers_before_its_final_snapshot_and_keeps_the_sandbox_until_it_is_stored(
        short_tmp: Path) -> None:
    activity = Activity(quiet_s=0.005, at_most_s=3600, loop=asyncio.get_running_loop())  # only quiet lets it go
    async with open_machine(short_tmp, snapshots=True, activity=activity) as machine:
        sid, _ = await machine.create()
        await machine.run(sid, "sh", "-c", "echo final > last.txt")
        activity.begin()  # a request in flight
        assert (await machine.ask(sid, "delete"))["status"] == "ended"
        assert await machine.lifecycle(sid) == ["created", "ended"]
        await asyncio.sleep(0.2)
        assert machine.counts() == {"waiting": 1}  # the workspace's sandbox stays until its snapshot is stored
        reader = machine.snapshots.reader(sid).get(timeout=T)  # a read of its files takes it first
        assert reader is not None
        with reader:
            assert reader.read_for_json("last.txt") == "final\n"
        wait_for(lambda: machine.counts() == {}, T, "the sandbox released once its snapshot was stored")
        activity.end()


# --- commands through the API and turns: what keeps the sandbox running --------------------------

async def test_the_sandbox_stays_running_until_the_last_command_and_the_turn_end(machine: Machine) -> None:
    sid, _ = await machine.create()
    await machine.ask(sid, "begin_exec")
    await machine.ask(sid, "begin_exec")
    assert machine.counts() == {"running": 1}
    await machine.ask(sid, "end_exec")
    assert machine.counts() == {"running": 1}  # one command still runs
    await machine.ask(sid, "end_exec")
    assert machine.counts() == {"waiting": 1}
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    await machine.ask(sid, "begin_exec")
    await machine.ask(sid, "end_exec")
    assert machine.counts() == {"running": 1}  # the turn still runs
    await machine.ask(sid, "begin_exec")
    await machine.ask(sid, "end_turn", ticket.query_id)
    assert machine.counts() == {"running": 1}  # the command still runs
    await machine.ask(sid, "end_exec")
    assert machine.counts() == {"waiting": 1}
    await machine.ask(sid, "end_exec")  # one too many: no count below zero
    await machine.ask(sid, "begin_exec")
    await machine.ask(sid, "end_exec")
    assert machine.counts() == {"waiting": 1}


# --- live config (PATCH .../config) --------------------------------------------------------------

async def test_a_config_change_is_stored_and_a_null_clears_it(machine: Machine) -> None:
    sid, _ = await machine.create(config={"allowedTools": ["Read"], "betas": ["b1"]})
    await machine.ask(sid, "pause")
    view = await machine.ask(sid, "configure", {"model": "m-2", "betas": None, "disallowedTools": ["Bash"]})
    assert (view["status"], view["model"], view["allowedTools"], view["disallowedTools"]) == (
        "paused", "m-2", ["Read"], ["Bash"])
    assert "betas" not in view
    row = await machine.row(sid)
    assert (row.model, json.loads(row.config)) == ("m-2", {"allowedTools": ["Read"], "disallowedTools": ["Bash"]})
    assert (await machine.ask(sid, "view"))["model"] == "m-2"


async def test_a_config_change_is_refused_while_starting_and_once_ended(machine: Machine) -> None:
    for status, code in (("starting", 409), ("ended", 410)):
        sid = await machine.insert(status)
        refused = await machine.refused(sid, "configure", {"model": "m-2"})
        assert refused.status_code == code, (status, refused.message)
        assert (await machine.row(sid)).model is None


async def test_initial_agent_must_name_one_of_the_subagents(machine: Machine) -> None:
    sid, _ = await machine.create()
    refused = await machine.refused(sid, "configure", {"initialAgent": "writer"})
    assert (refused.status_code, refused.message) == (
        400, "`initialAgent` 'writer' must name one of the session's `subagents` (none); change `initialAgent` "
             "(or clear it with null) together with `subagents`")
    subagents = {"reviewer": {"prompt": "review"}, "coder": {"prompt": "code"}}
    refused = await machine.refused(sid, "configure", {"subagents": subagents, "initialAgent": "writer"})
    assert "(coder, reviewer)" in refused.message
    assert json.loads((await machine.row(sid)).config) == {}  # nothing stored
    view = await machine.ask(sid, "configure", {"subagents": subagents, "initialAgent": "coder"})
    assert (view["initialAgent"], view["subagents"]) == ("coder", subagents)
    cleared = await machine.ask(sid, "configure", {"subagents": None, "initialAgent": None})
    assert "initialAgent" not in cleared and "subagents" not in cleared


async def test_config_changes_go_to_the_live_bridge_with_the_next_turn_only(machine: Machine) -> None:
    helper = machine.agents["helper"]
    machine.agents["helper"] = AgentView(helper.id, helper.name, 1, helper.path, "agent-model", {}, False)
    sid, _ = await machine.create(model="session-model")
    await machine.ask(sid, "configure", {"model": None, "allowedTools": ["Read"]})
    await machine.ask(sid, "configure", {"betas": ["b1"]})  # added to the changes not yet sent
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    # a cleared model falls back to the agent's, as at init
    assert ticket.live_config == {"model": "agent-model", "allowedTools": ["Read"], "betas": ["b1"]}
    await machine.ask(sid, "end_turn", ticket.query_id)
    ticket = await machine.ask(sid, "begin_turn", "again", None)
    assert ticket.live_config is None  # sent once
    await machine.ask(sid, "end_turn", ticket.query_id)

    await machine.ask(sid, "configure", {"model": "m-3"})
    await machine.ask(sid, "stop_session")
    await machine.ask(sid, "resume")  # a new sandbox: its init has the stored config
    ticket = await machine.ask(sid, "begin_turn", "third", None)
    assert (ticket.live_config, ticket.model) == (None, "m-3")


async def test_a_config_change_of_a_session_without_its_agent_still_reaches_the_bridge(machine: Machine) -> None:
    sid, _ = await machine.create(model="session-model")
    del machine.agents["helper"]  # the agent was deleted: the session works on
    await machine.ask(sid, "configure", {"model": None})
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    assert ticket.live_config == {"model": None}


# --- the sandbox's environment --------------------------------------------------------------------

def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def test_the_sandbox_gets_the_agent_credential_and_session_env_but_no_anthropic_key(
        machine: Machine) -> None:
    helper = machine.agents["helper"]
    machine.agents["helper"] = AgentView(helper.id, helper.name, 1, helper.path, None,
                                         {"FROM_AGENT": "a", "SHARED": "agent", "ANTHROPIC_AUTH_TOKEN": "sk-agent"},
                                         False)
    openai = await machine.credentials.create(TENANT, "openai", "sk-openai-123", None)
    sid, _ = await machine.create(credential_id=openai.id, extra_env={
        "SHARED": "session", "OPENAI_API_KEY": "sk-session", "ANTHROPIC_API_KEY": "sk-planted"})
    env = _env_of(await machine.run(sid, "env"))
    assert (env["FROM_AGENT"], env["SHARED"]) == ("a", "session")  # the session's env over the agent's
    assert env["OPENAI_API_KEY"] == "sk-session"  # ... and over the credential's
    assert "ANTHROPIC_API_KEY" not in env and "ANTHROPIC_AUTH_TOKEN" not in env

    other, _ = await machine.create(credential_id=openai.id)
    assert _env_of(await machine.run(other, "env"))["OPENAI_API_KEY"] == "sk-openai-123"

    anthropic = await machine.credentials.create(TENANT, "anthropic", "sk-ant-secret-456", None)
    third, _ = await machine.create(credential_id=anthropic.id)
    assert "sk-ant-secret-456" not in await machine.run(third, "env")  # the model proxy adds it


async def test_a_session_whose_credential_is_gone_fails_to_start_with_404(machine: Machine) -> None:
    with pytest.raises(ServiceError) as failed:
        await machine.create(credential_id="cred-gone")
    assert (failed.value.status_code, failed.value.message) == (404, "Credential cred-gone not found")
    [row] = await machine.sessions.list_views(TENANT, "helper")
    assert (row["status"], row["error"]) == ("error", "Credential cred-gone not found")
    assert machine.counts() == {}


async def test_a_cold_resume_whose_credential_is_gone_answers_404(machine: Machine) -> None:
    credential = await machine.credentials.create(TENANT, "openai", "sk-openai-123", None)
    sid, _ = await machine.create(credential_id=credential.id)
    await machine.ask(sid, "stop_session")
    await machine.credentials.delete(TENANT, credential.id)
    refused = await machine.refused(sid, "resume")
    assert (refused.status_code, refused.message) == (404, f"Credential {credential.id} not found")
    assert (await machine.row(sid)).status == "stopped"
    assert machine.counts() == {}  # the sandbox claimed for it went again


# --- status listener (webhooks' session.status_changed) -------------------------------------------

async def test_each_status_change_is_told_once_and_stands_when_its_listener_fails(machine: Machine) -> None:
    sid, _ = await machine.create()
    await machine.ask(sid, "pause")
    await machine.ask(sid, "resume")
    machine.listener_fails = True
    assert (await machine.ask(sid, "stop_session"))["status"] == "stopped"
    assert (await machine.row(sid)).status == "stopped"
    assert machine.statuses == [
        (TENANT, sid, "helper", "starting", "active", "created", {}),
        (TENANT, sid, "helper", "active", "paused", "paused", {}),
        (TENANT, sid, "helper", "paused", "active", "resumed", {"path": "warm"}),
        (TENANT, sid, "helper", "active", "stopped", "stopped", {}),
    ]
    machine.listener_fails = False
    # active to active (a session whose actor holds no sandbox, resumed cold): no status change
    active = await machine.insert("active")
    assert (await machine.ask(active, "resume"))["status"] == "active"
    assert await machine.lifecycle(active) == ["resumed"]
    assert [change for change in machine.statuses if change[1] == active] == []


# --- on a runner: the coordinators change sessions too ---------------------------------------------

async def test_on_a_runner_a_turn_reads_the_status_the_database_has(short_tmp: Path) -> None:
    async with open_machine(short_tmp, runner_id="runner-1") as machine:
        sid, _ = await machine.create()
        # a coordinator's liveness sweep paused it (it thought this runner dead)
        await machine.sessions.transition(sid, TENANT, "paused", "paused")
        refused = await machine.refused(sid, "begin_turn", "hello", None)
        assert (refused.status_code, refused.message) == (400, "Session is paused; resume it before sending messages")
        resumed = await machine.ask(sid, "resume")
        assert (resumed["status"], resumed["runnerId"]) == ("active", "runner-1")


async def test_on_a_runner_a_resume_claims_the_session_for_it(short_tmp: Path) -> None:
    async with open_machine(short_tmp, runner_id="runner-1") as machine:
        sid = await machine.insert("paused")
        async with machine.sessions.db.tx() as s:  # last held by a runner that died
            await s.execute(update(Session).where(Session.id == sid).values(runner_id="runner-dead"))
        resumed = await machine.ask(sid, "resume")
        assert (resumed["status"], resumed["runnerId"]) == ("active", "runner-1")
        assert (await machine.row(sid)).runner_id == "runner-1"


async def test_a_runner_whose_session_was_resumed_elsewhere_lets_its_sandbox_go(short_tmp: Path) -> None:
    async with open_machine(short_tmp, runner_id="runner-1") as machine:
        sid, _ = await machine.create()
        # thought dead: the session was resumed on runner-2 meanwhile
        await machine.sessions.transition(sid, TENANT, "active", "resumed", runner_id="runner-2", sandbox_id="sb-2")
        refused = await machine.refused(sid, "pause")
        assert refused.status_code == 409, refused.message
        row = await machine.row(sid)
        assert (row.status, row.runner_id, row.sandbox_id) == ("active", "runner-2", "sb-2")  # not written
        wait_for(lambda: machine.counts() == {}, T, "this runner's stale sandbox released")
        assert await machine.lifecycle(sid) == ["created", "resumed"]



async def test_an_interrupt_is_sent_and_the_turn_runs_until_it_ends(machine: Machine) -> None:
    sid, _ = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    assert await machine.ask(sid, "interrupt") == {"ok": True, "sessionId": sid}
    assert await machine.ask(sid, "running_turn") == ticket.query_id  # the turn's end is the stream's to store
    await machine.ask(sid, "end_turn", ticket.query_id)
    assert await machine.ask(sid, "running_turn") is None
    assert (await machine.refused(sid, "interrupt")).status_code == 409


async def test_a_turn_ticket_names_the_session_sandbox_and_model(machine: Machine) -> None:
    sid, view = await machine.create(model="session-model")
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    assert (ticket.session_id, ticket.tenant, ticket.agent_name, ticket.sandbox_id, ticket.model) == (
        sid, TENANT, "helper", view["sandboxId"], "session-model")
    assert ticket.query_id.startswith("q-") and len(ticket.query_id) == 14
    await machine.ask(sid, "end_turn", ticket.query_id)
    ticket = await machine.ask(sid, "begin_turn", "again", "message-model")  # the message's model wins
    assert ticket.model == "message-model"


async def test_a_view_during_and_after_a_turn_shows_its_last_activity(machine: Machine) -> None:
    sid, _ = await machine.create()
    created = await machine.row(sid)
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    stored = await machine.row(sid)  # the user message moved it
    assert stored.last_active_at != created.last_active_at
    assert await machine.ask(sid, "view") == session_json(stored)
    await machine.ask(sid, "end_turn", ticket.query_id)
    stored = await machine.row(sid)
    assert stored.last_active_at is not None
    assert (await machine.ask(sid, "view"))["lastActiveAt"] == iso(stored.last_active_at)


async def test_the_registry_keeps_no_view_answered_before_a_turn_that_ended_meanwhile(machine: Machine) -> None:
    # A PATCH's answer shows the row its write returned. A turn that ended while that answer was on
    # its way stored more (lastActiveAt, the counts): the registry must not keep the older view for GET.
    assert machine.deps is not None
    registry = SessionRegistry(machine.deps)
    try:
        sid = new_id()
        await registry.create(CreateRequest(sid, TENANT, "helper", None, {}, agent=machine.agents["helper"]),
                              encrypted_env=None)
        ticket = await registry.begin_turn(TENANT, sid, "hello", None)
        gate = machine.sessions.stall(sid, "update_config")
        patch = asyncio.ensure_future(registry.configure(TENANT, sid, {"allowedTools": ["Read"]}))
        await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)  # its row is stored and read
        await machine.sessions.store_turn_batch(sid, TENANT, [("assistant", '{"type":"assistant"}')], [])
        ending = asyncio.ensure_future(registry.end_turn_now(ticket))  # queued behind the PATCH
        await asyncio.sleep(0.05)
        gate.set()
        patched = await asyncio.wait_for(patch, T)
        await asyncio.wait_for(ending, T)
        stored = await machine.row(sid)
        assert patched["allowedTools"] == ["Read"] and patched["lastActiveAt"] != iso(stored.last_active_at)
        view = await registry.view(TENANT, sid)
        assert view["lastActiveAt"] == iso(stored.last_active_at) and view == session_json(stored)
    finally:
        await registry.stop_all()


async def test_commands_need_an_active_session_and_bring_a_dead_sandbox_back(machine: Machine) -> None:
    for status, message in (("ended", "Session is ended; create a new session"),
                            ("paused", "Session is paused; resume it before running commands")):
        sid = await machine.insert(status)
        refused = await machine.refused(sid, "begin_exec")
        assert (refused.status_code, refused.message) == (400, message)
    sid, view = await machine.create()
    machine.launcher.procs[view["sandboxId"]].popen.kill()
    wait_for(lambda: not machine.pool.is_alive(view["sandboxId"]).get(timeout=T), T, "the sandbox dead")
    assert await machine.run(sid, "echo", "back") == "back\n"  # on a new sandbox
    assert (await machine.ask(sid, "workspace")) != machine.launcher.paths_for(view["sandboxId"]).workspace


async def test_a_command_while_a_turn_runs_in_a_dead_sandbox_is_refused(machine: Machine) -> None:
    sid, view = await machine.create()
    ticket = await machine.ask(sid, "begin_turn", "hello", None)
    machine.launcher.procs[view["sandboxId"]].popen.kill()
    wait_for(lambda: not machine.pool.is_alive(view["sandboxId"]).get(timeout=T), T, "the sandbox dead")
    refused = await machine.refused(sid, "begin_exec")
    assert (refused.status_code, refused.message) == (
        500, "the session's sandbox is not running; try again after the running turn")
    assert await machine.ask(sid, "running_turn") == ticket.query_id


async def test_network_comes_from_the_session_config_else_the_agent(machine: Machine) -> None:
    plain, view = await machine.create()
    configured, configured_view = await machine.create(config={"network": True})
    helper = machine.agents["helper"]
    machine.agents["helper"] = AgentView(helper.id, helper.name, 1, helper.path, None, {}, True)
    networked, networked_view = await machine.create()
    assert [machine.launcher.specs[v["sandboxId"]].network for v in (view, configured_view, networked_view)] == [
        False, True, True]


async def test_a_lost_sandbox_pause_records_why(machine: Machine) -> None:
    sid, view = await machine.create()
    await machine.ask(sid, "sandbox_lost", SandboxLost(sid, view["sandboxId"], LossReason.IDLE, "idle timeout"))
    assert (await machine.lifecycle_events(sid))[-1] == {
        "action": "paused", "status": "paused", "reason": LossReason.IDLE.value, "detail": "idle timeout"}
    assert await machine.ask(sid, "workspace") is None
    assert await machine.ask(sid, "retirable") is True

    paused, paused_view = await machine.create()  # a paused session keeps its sandbox, until it is lost
    await machine.ask(paused, "pause")
    await machine.ask(paused, "sandbox_lost",
                      SandboxLost(paused, paused_view["sandboxId"], LossReason.IDLE, "idle timeout"))
    assert await machine.lifecycle(paused) == ["created", "paused"]  # already paused: nothing to record
    assert await machine.ask(paused, "workspace") is None


async def test_a_delete_before_a_purge_takes_no_snapshot(short_tmp: Path) -> None:
    async with open_machine(short_tmp, snapshots=True) as machine:
        sid, _ = await machine.create()
        assert (await machine.ask(sid, "delete", False))["status"] == "ended"
        assert machine.snapshots.latest(sid).get(timeout=T) is None
        other, _ = await machine.create()
        assert (await machine.ask(other, "delete"))["status"] == "ended"
        assert machine.snapshots.latest(other).get(timeout=T) is not None


async def test_pauses_waiting_for_a_turn_get_the_error_of_the_pause_that_failed(short_tmp: Path) -> None:
    async with open_machine(short_tmp, runner_id="runner-1") as machine:
        sid, _ = await machine.create()
        ticket = await machine.ask(sid, "begin_turn", "hello", None)
        pauses = [asyncio.ensure_future(machine.ask(sid, "pause")) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert not any(p.done() for p in pauses)
        # meanwhile the session was resumed on runner-2 (this runner was thought dead)
        await machine.sessions.transition(sid, TENANT, "active", "resumed", runner_id="runner-2", sandbox_id="sb-2")
        await machine.ask(sid, "end_turn", ticket.query_id)
        for pause in pauses:
            with pytest.raises(ServiceError) as refused:
                await pause
            assert refused.value.status_code == 409
        assert (await machine.row(sid)).status == "active"
        assert await machine.lifecycle(sid) == ["created", "resumed"]


# --- what goes with the sandbox: its logs and its model socket ------------------------------------

async def test_a_delete_answers_before_its_sandbox_is_let_go(short_tmp: Path) -> None:
    """DELETE answers once the status is stored; the sandbox goes after, its last lines stored a
    moment later (a stop waits for them: see the test above)."""
    async with open_machine(short_tmp, logs=True) as machine:
        assert machine.logs is not None
        sid, view = await machine.create()
        _sandbox_prints(machine, view["sandboxId"], "deleted-last-words")
        gate = machine.logs.stall()
        # Letting the sandbox go waits at the gate for up to ask_timeout (T): the answer does not.
        async with asyncio.timeout(T / 2):
            assert (await machine.ask(sid, "delete"))["status"] == "ended"
        assert await _logs(machine, sid) == []
        gate.set()
        await asyncio.wait_for(_until(lambda: _logs(machine, sid), ("sandbox", "deleted-last-words")), T)


async def _logs(machine: Machine, sid: str) -> list[tuple[str, str]]:
    assert machine.logs is not None  # from the first line on (index 0), as the API's default `after=-1`
    return [(line["source"], line["text"]) for line in await machine.logs.list(TENANT, sid, -1, 100)]


async def test_setup_output_that_comes_before_its_session_row_is_stored_waits_for_it(short_tmp: Path) -> None:
    """A create starts the sandbox while its row is inserted: lines the setup prints first are stored
    once the row is (a line stored before it would have no session), before the creation answers."""
    async with open_machine(short_tmp, logs=True) as machine:
        (Path(machine.agents["helper"].path) / "setup.sh").write_text("echo before-the-row\n")
        sid = new_id()
        gate = machine.sessions.stall(sid, "insert")
        creating = asyncio.ensure_future(machine.create(sid=sid))
        await asyncio.wait_for(machine.sessions.stalled[sid].wait(), T)
        await asyncio.sleep(0.5)  # the sandbox starts and its setup prints meanwhile
        assert not creating.done()
        gate.set()
        _, view = await creating
        assert view["status"] == "active"
        assert ("setup", "before-the-row") in await _logs(machine, sid)


async def test_setup_output_is_stored_before_creation_answers_and_a_sandbox_last_lines_when_it_goes(
        short_tmp: Path) -> None:
    async with open_machine(short_tmp, logs=True) as machine:
        (Path(machine.agents["helper"].path) / "setup.sh").write_text("echo setting-up\n")
        stopped, view = await machine.create()
        assert ("setup", "setting-up") in await _logs(machine, stopped)
        # what the sandbox's processes print goes to its log file (the real launcher's stderr)
        _sandbox_prints(machine, view["sandboxId"], "stopped-last-words")
        await machine.ask(stopped, "stop_session")
        assert ("sandbox", "stopped-last-words") in await _logs(machine, stopped)

        lost, view = await machine.create()
        _sandbox_prints(machine, view["sandboxId"], "why-it-died")
        await machine.ask(lost, "sandbox_lost", SandboxLost(lost, view["sandboxId"], LossReason.EXITED, "killed"))
        await asyncio.wait_for(_until(lambda: _logs(machine, lost), ("sandbox", "why-it-died")), T)


def _sandbox_prints(machine: Machine, sandbox_id: str, line: str) -> None:
    log_file = machine.launcher.paths_for(sandbox_id).logs / "sandbox.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as f:
        f.write(line + "\n")


async def _until(read: Any, item: Any) -> None:
    while item not in await read():
        await asyncio.sleep(0.05)


HAIKU = "claude-haiku-4-5"


async def test_an_anthropic_credential_pays_for_the_session_model_calls(
        short_tmp: Path, fake_model: FakeModel) -> None:  # noqa: F811
    async with open_machine(short_tmp, model_url=fake_model.url) as machine:
        proxy = machine.model_proxy
        assert proxy is not None
        credential = await machine.credentials.create(TENANT, "anthropic", "sk-ant-paying-789", None)
        sid, view = await machine.create(credential_id=credential.id, model="claude-sonnet-4-5")
        ticket = await machine.ask(sid, "begin_turn", "hello", None)
        proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, None)  # as the turn driver does
        socket_path = machine.launcher.paths_for(view["sandboxId"]).model_socket
        async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(socket_path))) as client:
            reply = await client.post("http://model/v1/messages", json={
                "model": "claude-sonnet-4-5", "max_tokens": 100,
                "messages": [{"role": "user", "content": "PAID-BY hi"}]})
            assert reply.status_code == 200, reply.text
            [request] = fake_model.requests_containing("PAID-BY")
            assert request["headers"].get("x-api-key") == "sk-ant-paying-789"
            refused = await client.post("http://model/v1/messages", json={
                "model": HAIKU, "max_tokens": 100, "messages": [{"role": "user", "content": "NOT-YET hi"}]})
            assert refused.status_code == 403, refused.text  # not one of the session's models
            await machine.ask(sid, "end_turn", ticket.query_id)

            # a subagent configured on the live session: its model may be called from the next turn on
            await machine.ask(sid, "configure", {"subagents": {"reviewer": {"prompt": "r", "model": HAIKU}}})
            ticket = await machine.ask(sid, "begin_turn", "again", None)
            proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, None)
            reply = await client.post("http://model/v1/messages", json={
                "model": HAIKU, "max_tokens": 100, "messages": [{"role": "user", "content": "SUBAGENT hi"}]})
            assert reply.status_code == 200, reply.text
            assert len(fake_model.requests_containing("SUBAGENT")) == 1
            await machine.ask(sid, "end_turn", ticket.query_id)
        await machine.ask(sid, "stop_session")
        assert not socket_path.exists()  # the model socket went with the sandbox


async def test_a_pause_interrupts_the_running_turn_and_is_answered_once_it_is_stored(
        short_tmp: Path, fake_model: FakeModel) -> None:  # noqa: F811
    # The model's answer takes T: the turn ends before it only if the pause interrupted it. (The proxy
    # waits for that answer when its sandbox goes, so more would only make the test slower.)
    fake_model.script("SLOW-TURN", [{"content": [{"type": "text", "text": "too late"}], "wait": T}])
    async with open_machine(short_tmp, model_url=fake_model.url) as machine:
        proxy = machine.model_proxy
        assert proxy is not None
        sid, _ = await machine.create(model="claude-sonnet-4-5")
        ticket = await machine.ask(sid, "begin_turn", "SLOW-TURN", None)
        proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, None)  # as the turn driver does
        proxy.set_key_provider(ticket.sandbox_id, lambda: "sk-test")  # no credential, no server key
        frames: list[dict[str, Any]] = []

        async def drive() -> None:  # the stream handler's part: the query, then end_turn
            async for frame in ticket.connection.query("SLOW-TURN hi", model=ticket.model, query_id=ticket.query_id):
                frames.append(frame)

        turn = asyncio.ensure_future(drive())
        await until(lambda: bool(fake_model.requests_containing("SLOW-TURN")) or turn.done(), "the turn's model call")
        first = asyncio.ensure_future(machine.ask(sid, "pause"))
        async with asyncio.timeout(2 * T):
            await turn
        assert any("session paused" in str(frame.get("error")) for frame in frames), frames
        second = asyncio.ensure_future(machine.ask(sid, "pause"))  # asked while the turn is being stored
        await asyncio.sleep(0.2)
        assert not first.done() and not second.done()
        await machine.ask(sid, "end_turn", ticket.query_id)
        assert [(await first)["status"], (await second)["status"]] == ["paused", "paused"]


async def test_a_session_without_a_model_of_its_own_calls_its_agents(
        short_tmp: Path, fake_model: FakeModel) -> None:  # noqa: F811
    fake_model.script("AGENT-MODEL", [{"content": [{"type": "text", "text": "answered"}]}])
    async with open_machine(short_tmp, model_url=fake_model.url) as machine:
        proxy = machine.model_proxy
        assert proxy is not None
        helper = machine.agents["helper"]
        machine.agents["helper"] = AgentView(helper.id, helper.name, helper.version, helper.path, HAIKU, {}, False)
        sid, _ = await machine.create()
        ticket = await machine.ask(sid, "begin_turn", "AGENT-MODEL", None)
        assert ticket.model is None  # the turn names none: the bridge's, from its init, is used
        proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, None)
        proxy.set_key_provider(ticket.sandbox_id, lambda: "sk-test")
        frames = [frame async for frame in ticket.connection.query("AGENT-MODEL hi", query_id=ticket.query_id)]
        await machine.ask(sid, "end_turn", ticket.query_id)
        [request] = fake_model.requests_containing("AGENT-MODEL")
        assert request["body"]["model"] == HAIKU, frames


async def test_the_sandbox_disk_is_the_sessions_disk_mb_else_the_agents(short_tmp: Path) -> None:
    async with open_machine(short_tmp, disk_quota=True) as machine:
        helper = machine.agents["helper"]
        machine.agents["big"] = AgentView("a3", "big", 1, helper.path, None, {}, False, disk_mb=32)
        views = [(await machine.create("big", config={"diskMb": 64}))[1], (await machine.create("big"))[1],
                 (await machine.create())[1]]
        sizes = [machine.launcher.specs[view["sandboxId"]].limits.disk_bytes for view in views]
        assert sizes == [64 * 1024 * 1024, 32 * 1024 * 1024, SandboxLimits().disk_bytes]


async def test_a_delete_gives_its_sandbox_back_to_the_pool_at_once(machine: Machine) -> None:
    """The pool counts a deleted session's sandbox gone as the DELETE answers (its place is free for
    the next create); a session whose sandbox is already gone (stopped) is deleted all the same."""
    sid, _view = await machine.create()
    assert machine.counts() == {"waiting": 1}
    assert (await machine.ask(sid, "delete"))["status"] == "ended"
    assert machine.counts() == {}
    stopped, _view = await machine.create()
    await machine.ask(stopped, "stop_session")
    assert machine.counts() == {}
    assert (await machine.ask(stopped, "delete"))["status"] == "ended"


async def test_an_actor_retires_in_its_own_turn_and_what_came_after_finds_it_gone(machine: Machine) -> None:
    # What came before the retirement is answered; what came after is not handled at all (ActorGone),
    # which the registry asks again of a new actor. A stop message instead failed a running request.
    sid, _ = await machine.create()
    await machine.ask(sid, "stop_session")
    ref = machine.actors[sid]
    retiring = machine.actor(sid).retire()
    after = machine.actor(sid).view()
    assert await call(retiring, 2 * T) is True
    with pytest.raises(ActorGone):
        await call(after, 2 * T)
    assert not ref.is_alive()

    paused, _ = await machine.create()
    await machine.ask(paused, "pause")
    assert await machine.ask(paused, "retire") is False  # it keeps its sandbox, and its actor
    assert machine.actors[paused].is_alive()

    busy, _ = await machine.create()
    ref = machine.actors[busy]
    pausing = machine.actor(busy).pause()
    retire_soon(ref)
    after = machine.actor(busy).view()
    assert (await call(pausing, 2 * T))["status"] == "paused"
    with pytest.raises(ActorGone):
        await call(after, 2 * T)
    assert ref.actor_stopped.wait(2 * T)
