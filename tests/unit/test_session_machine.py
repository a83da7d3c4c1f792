"""The session's state machine on its own: SessionActor messages, no HTTP.

Real parts: the session rows in SQLite, a real PoolActor, and real bridge processes (unsandboxed,
tests/fixtures/plain_launcher.py) that the actor connects to and configures. Each rejection of
the state table is checked with the exact status the API answers; each accepted transition by
the stored row the next request reads. The HTTP view of the same table is
tests/integration/test_session_states.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from ashd.actors._aio import call
from ashd.actors._pool import PoolActor, PoolConfig
from ashd.actors._pool_types import LossReason, SandboxLost
from ashd.actors._session import SessionActor
from ashd.actors._session_deps import CreateRequest, SessionDeps
from ashd.errors import NotFound, ServiceError
from ashd.sandboxing._types import SandboxSpec
from ashd.storage import Database
from ashd.storage._agents import AgentView
from ashd.storage._crypto import Cipher
from ashd.storage._models import Agent, Session, new_id
from ashd.storage._sessions import Sessions
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
        """Hold the session's `call`s (transition, all_message_contents) until the returned gate is set."""
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

    def transition_soon(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        # A stalled session's transition waits on the loop; the others take the writer thread as in
        # the server, so both ways the actor can be told an outcome are exercised.
        if (session_id, "transition") in self.gates:
            return self.transition(session_id, *args, **kwargs)
        return super().transition_soon(session_id, *args, **kwargs)

    async def all_message_contents(self, session_id: str) -> list[dict[str, Any]]:
        await self._gate(session_id, "all_message_contents")
        return await super().all_message_contents(session_id)


@dataclass
class Machine:
    """SessionDeps over real storage and a real pool; `actor(sid)` starts a SessionActor."""

    sessions: StallingSessions
    pool: Any  # PoolActor proxy
    launcher: PlainLauncher
    agents: dict[str, AgentView]
    deps: SessionDeps | None = None
    actors: dict[str, Any] = field(default_factory=dict)
    resumes: list[tuple[str, str]] = field(default_factory=list)

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

    async def create(self, agent: str = "helper", env: bytes | None = None) -> tuple[str, dict[str, Any]]:
        sid = new_id()
        row = Session(id=sid, tenant_id=TENANT, agent_name=agent, model=None, status="starting", config="{}",
                      env_ciphertext=env)
        await self.sessions.insert(row)
        req = CreateRequest(sid, TENANT, agent, None, {}, agent=self.agents[agent])
        view: dict[str, Any] = await call(self.actor(sid).create(req, row), 2 * T)
        return sid, view

    async def row(self, sid: str) -> Session:
        return await self.sessions.get(TENANT, sid)

    async def lifecycle(self, sid: str) -> list[str]:
        events = await self.sessions.events(TENANT, sid, 0, 100, "lifecycle")
        return [json.loads(e["data"])["action"] for e in events]

    def counts(self) -> dict[str, int]:
        stats: dict[str, int] = self.pool.stats().get(timeout=T)
        return {k: stats[k] for k in ("warming", "warm", "waiting", "running") if stats[k]}


@pytest.fixture
async def machine(short_tmp: Path) -> AsyncIterator[Machine]:
    db = await Database.open(f"sqlite+aiosqlite:///{short_tmp / 'ashd.db'}")
    launcher = PlainLauncher(short_tmp / "sb", bridge=True)
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
    pool_ref = PoolActor.start(PoolConfig(max_capacity=3, prewarm=0, idle_timeout=3600.0, shutdown_grace=1.0),
                               launcher, spec_for, None, lost.append)
    m = Machine(StallingSessions(db), pool_ref.proxy(), launcher, agents)

    async def resolve_agent(_tenant: str, name: str) -> AgentView:
        if name not in agents:
            raise NotFound(f"Agent {name} not found")
        return agents[name]

    async def resolve_credential(_tenant: str, cid: str) -> Any:
        raise NotFound(f"Credential {cid} not found")

    async def record_usage(*_args: Any) -> None:
        return None

    m.deps = SessionDeps(
        loop=asyncio.get_running_loop(), sessions=m.sessions, pool=m.pool, snapshots=None, model_proxy=None,
        resolve_agent=resolve_agent, resolve_credential=resolve_credential,
        decrypt_env=decrypt_env, count_resume=lambda path, sid, _agent: m.resumes.append((path, sid)),
        record_usage=record_usage, fallback_api_key=None, ask_timeout=T, setup_timeout=T, shutdown_grace=1.0,
        network_default=False, sandbox_owner=lambda _sid: None)
    try:
        yield m
    finally:
        for ref in m.actors.values():
            if ref.is_alive():
                ref.stop(block=False)
        await asyncio.to_thread(lambda: pool_ref.stop(block=True, timeout=60))
        launcher.kill_all()
        await db.close()


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


async def test_every_refused_transition_has_its_status_and_changes_nothing(machine: Machine) -> None:
    for (message, status), code in REFUSED.items():
        sid = await machine.insert(status, error="boom" if status == "error" else None)
        args: tuple[Any, ...] = ("hello", None) if message == "begin_turn" else ()
        refused = await machine.refused(sid, message, *args)
        assert refused.status_code == code, (message, status, refused.message)
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


async def test_a_creation_failure_of_any_kind_leaves_the_session_in_error(machine: Machine) -> None:
    # The session's environment was encrypted under another key (the server's key was replaced):
    # decrypting it fails with the cipher's own exception, not a ServiceError.
    foreign = Cipher(bytes(32)).encrypt_json({"TOKEN": "x"}, b"whatever")
    with pytest.raises(ServiceError) as failed:
        await machine.create(env=foreign)
    assert failed.value.status_code == 500
    [row] = await machine.sessions.list(TENANT, "helper")
    assert row.status == "error" and row.error is not None
    assert failed.value.message.startswith("Sandbox creation failed") and "server log" in row.error
    assert await machine.lifecycle(row.id) == ["error"]
    assert machine.counts() == {}  # nothing was claimed


async def test_a_failed_start_releases_its_sandbox(machine: Machine) -> None:
    (machine.launcher.root / "agent-gone").mkdir(parents=True)
    machine.agents["gone"] = AgentView("a2", "gone", 1, str(machine.launcher.root / "agent-gone"), None, {}, False)
    with pytest.raises(ServiceError) as failed:  # no AGENT.md: the copy into the workspace refuses
        await machine.create("gone")
    assert failed.value.status_code == 500 and "AGENT.md" in failed.value.message
    [row] = await machine.sessions.list(TENANT, "gone")
    assert (row.status, row.error) == ("error", failed.value.message)
    wait_for(lambda: machine.counts() == {}, T, "the failed session's sandbox released")


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
    await machine.sessions.insert(row)
    gate = machine.sessions.stall(sid)
    creating = asyncio.ensure_future(call(machine.actor(sid).create(
        CreateRequest(sid, TENANT, "helper", None, {}, agent=machine.agents["helper"]), row), 2 * T))
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
