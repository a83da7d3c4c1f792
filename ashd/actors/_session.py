"""SessionActor: the one owner of a live session's status, sandbox and running turn.

Every transition of one session is a staged request (`_staged.py`): one runs at a time, and those
that arrive meanwhile wait their turn, so pause-during-turn, double resume and delete-during-create
each have one answer. Database and bridge work are coroutines the handlers yield: they run on the
event loop and their outcome comes back as a message, so the actor's thread never waits for the
loop and the loop never waits for the actor. `running_turn` and `workspace` answer at once, from
the state the last finished transition left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ashd.actors._aio import ActorGone, Asker, Later, call, forget, spawn_on_loop
from ashd.actors._inline import call_inline
from ashd.actors._pool_types import Launching, SandboxHandle, SandboxLost
from ashd.actors._session_deps import CreateRequest, SendQuery, SentQuery, SessionDeps, TurnTicket
from ashd.actors._staged import ON_ACTOR_THREAD, OnLoop, Stage, StagedActor, staged
from ashd.actors._turn import EVENT_BLOCK
from ashd.errors import (
    BadRequest,
    Conflict,
    DiskQuotaExceeded,
    Gone,
    SandboxError,
    ServiceError,
    StorageError,
    StorageFull,
)
from ashd.sandboxing import prepare_workspace, small_agent
from ashd.storage import (
    Session,
    SessionHeldElsewhere,
    SnapshotTooLarge,
    check_fits,
    log_failure,
    session_json,
    storage_failure,
)

T = TypeVar("T")
log = logging.getLogger(__name__)
# A DELETE handled on the loop (`_inline_ok`) walks the workspace there only up to this many entries
# (a new agent's is a few dozen: a fraction of a millisecond); a larger one is walked on this
# actor's thread, where a long walk holds up no one else.
INLINE_WALK_ENTRIES = 128
# A create handled on the loop copies the agent folder there up to this size (a few dozen files of
# a new agent: a fraction of a millisecond); a larger one is copied on this actor's thread.
INLINE_COPY_ENTRIES = 128
INLINE_COPY_BYTES = 1024 * 1024

_ANTHROPIC_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
# A new session's row being inserted (see `SessionActor.create`).
Inserted = concurrent.futures.Future[Session]


async def _withdrawn(sent: SentQuery) -> None:
    """The query withdrawn on the loop, whichever thread the failed write's outcome came to: the
    model proxy's turn is the loop's."""
    await sent.withdraw()


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SessionActor(StagedActor):
    lazy_thread = True  # a session handled on the loop only (created, paused, resumed) needs none

    def __init__(self, deps: SessionDeps, session_id: str, tenant: str) -> None:
        super().__init__(deps.loop, deps.ask_timeout)
        self.deps = deps
        self.session_id = session_id
        self.tenant = tenant
        self.row: Session | None = None
        self._turn_since_row = False  # a turn began or ended since `row` was read (see `_fresh_row`)
        self.handle: SandboxHandle | None = None
        self.conn: Any = None
        self.turn: TurnTicket | None = None
        # Pause requests waiting for the running turn to be interrupted and stored (see `pause`).
        self._pause_waiters: list[Later[dict[str, Any]]] = []
        # A stop's or a DELETE's requests waiting for the running turn's end (`_after_turn`), and the
        # bound on that wait: a turn that does not end within the grace is cut short as before.
        self._ending: list[tuple[str, Later[dict[str, Any]]]] = []
        self._ending_bound: concurrent.futures.Future[Any] | None = None
        self._ending_query = ""  # the turn they wait for
        self._execs = 0  # commands of POST .../exec running in the sandbox
        # Why the last sandbox this session let go went (`let_go_why`): a command it ran says so.
        self._let_go_why = ""
        # Config changes (PATCH .../config) the live bridge has not been sent yet: they go with the next
        # query. A bridge started later gets the stored config in its init instead.
        self._live_changes: dict[str, Any] | None = None

    def _inline_ok(self, name: str) -> bool:
        """A create, a pause or a DELETE with no turn running, a warm resume, a turn's start and its
        end, and a retirement (memory only) may be handled on the loop while this actor is idle
        (`_inline.py`): their steps there read this actor's state and store at most one
        transaction, which goes to the writer thread when the database is not free at once; a
        create's claim of a sandbox is awaited there, not waited for. A resume or a turn that finds
        its sandbox gone, a DELETE of a workspace of more than INLINE_WALK_ENTRIES entries, and a
        create whose agent folder is larger than INLINE_COPY_ENTRIES entries or INLINE_COPY_BYTES,
        go on on this actor's thread (`ON_ACTOR_THREAD`). Not on a runner: its transitions are
        fenced, and one fenced out lets its sandbox go, which waits for the pool."""
        if self.deps.runner_id is not None:
            return False
        if name in ("create", "retire"):  # a create's large agent folder is copied on this thread
            return True
        if self.row is None:
            return False
        if name in ("pause", "delete"):  # a DELETE's walk of a large workspace goes to this thread
            return self.turn is None
        if name in ("resume", "begin_turn"):
            return self.handle is not None and self.handle.alive is not None and self.conn is not None
        # A turn's end: the sandbox's state goes to the pool by a tell (`unhold`), and a pause asked
        # for during the turn is a transition, as a pause handled here is.
        return name == "end_turn"

    def _then_here(self) -> bool:
        """Whether a create, a fork or a cold resume goes on on the loop once its bridge is configured
        (`OnLoop.then_here`): what is left then is the `active` transition and memory. Not on a runner,
        for the reason `_inline_ok` gives."""
        return self.deps.runner_id is None

    # --- reads ---------------------------------------------------------------------------------
    @staged
    def view(self) -> Stage[dict[str, Any]]:
        return session_json((yield from self._fresh_row()))

    def _shared_row(self) -> Stage[Session]:
        """The row as the database has it, on a runner: coordinators change sessions there too (a
        liveness sweep pauses the sessions of a runner it thought dead), so a runner does not act on
        its cached copy when a resume or a turn begins. Standalone, this actor is the only writer."""
        if self.deps.runner_id is not None:
            self.row = None
        return (yield from self._row())

    def _row(self) -> Stage[Session]:
        """The row as this actor last stored or read it: right about everything but what a turn
        changed since (lastActiveAt and the counts), which only answers that show the row need."""
        if self.row is None:
            self.row = yield self.deps.sessions.get(self.tenant, self.session_id)
            self._turn_since_row = False
        return self.row

    def _fresh_row(self) -> Stage[Session]:
        """The row with what the turns since it was read changed in storage: for an answer that shows it."""
        if self._turn_since_row:
            self.row = None
        return (yield from self._row())

    # --- create / resume -----------------------------------------------------------------------
    @staged
    def create(self, req: CreateRequest, row: Session, inserted: Inserted) -> Stage[dict[str, Any]]:
        """Start the new session's sandbox. Its row (`inserted`) is mostly stored already (SQLite,
        `Sessions.insert_soon`); an insert that had to wait goes on beside the start, the bridge's
        `init` in the sandbox's process beside the database write. The row is waited for before
        anything else is stored about the session."""
        self.row = row  # being inserted, as it is: all a start reads is in it
        return (yield from self._first_start("created", None, resume_history=False, restore=False,
                                             agent=req.agent, inserted=inserted))

    @staged
    def start_fork(self, row: Session) -> Stage[dict[str, Any]]:
        """Bring up a fork: its snapshot (the parent's workspace) restored and its copied conversation
        handed to the engine, as on a cold resume."""
        self.row = row
        return (yield from self._first_start("forked", {"parentSessionId": row.parent_session_id},
                                             resume_history=True, restore=True))

    def _first_start(self, action: str, extra: dict[str, Any] | None, *, resume_history: bool, restore: bool,
                     agent: Any = None, inserted: Inserted | None = None) -> Stage[dict[str, Any]]:
        try:
            yield from self._start_sandbox(resume_history=resume_history, restore=restore, agent=agent,
                                           inserted=inserted, then_here=self._then_here())
        except ServiceError as exc:
            yield from self._stored(inserted)  # an insert that failed is the answer: nothing was stored
            yield from self._fail(exc.message)
            raise
        except Exception as exc:
            yield from self._stored(inserted)
            log_failure(log, "session creation failed", exc, sessionId=self.session_id)
            mapped = storage_failure(exc)  # the workspace copy met a full disk: 507, not 500
            # The exception's text names host paths (data dir, sandbox dirs): it stays in the log.
            reason = f"sandbox creation failed ({type(exc).__name__}); the details are in the server log"
            yield from self._fail(mapped.message if mapped else reason)
            raise (mapped or SandboxError(f"Sandbox creation failed ({type(exc).__name__}); the details are in "
                                          "the server log")) from exc
        try:
            yield from self._stored(inserted)
        except BaseException:
            yield from self._drop_sandbox()  # nothing was stored: the sandbox is nobody's
            raise
        self.row = yield from self._transition("active", action, extra=extra,
                                               sandbox_id=self.handle.sandbox_id if self.handle else "")
        return session_json(self.row)

    def _stored(self, inserted: Inserted | None) -> Stage[None]:
        """Wait for the row's insert (see `create`); its error, if it failed, is raised here."""
        if inserted is not None:
            self.row = yield inserted

    @staged
    def resume(self) -> Stage[dict[str, Any]]:
        row = yield from self._shared_row()
        if row.status == "ended":
            raise Gone("Session has ended; create a new session")
        if row.status == "active" and self.conn is not None:
            return session_json((yield from self._fresh_row()))
        # Resuming needs the agent on either path (404 "session or agent not found"); a session
        # that is still active keeps working without it (DELETE removes the registration only).
        # A warm resume needs nothing of it but its existence, checked in the transition's own
        # transaction below; a cold one needs its folder, env and limits to start a sandbox.
        path, restored = "cold", False
        if self.handle is not None and self.conn is not None and self._pool_alive(self.handle):
            path = "warm"
        else:
            yield ON_ACTOR_THREAD  # a cold start asks the pool: never from the loop (`_inline_ok`)
            if self.handle is not None:  # died before its pool noticed: its workspace is saved first
                self.deps.pool.check_exited(self.handle.sandbox_id).get(timeout=self.deps.ask_timeout)
            agent = yield self.deps.resolve_agent(self.tenant, row.agent_name)
            yield from self._drop_sandbox()
            try:
                restored = yield from self._start_sandbox(resume_history=True, restore=True, agent=agent,
                                                          then_here=self._then_here())
            except ServiceError:
                raise
            except Exception as exc:
                log_failure(log, "cold resume failed", exc, sessionId=self.session_id)
                mapped = storage_failure(exc)  # restoring the snapshot met a full disk: 507
                raise (mapped or SandboxError(f"A new sandbox could not be created for cold resume "
                                              f"({type(exc).__name__}); the details are in the server log")) from exc
        extra: dict[str, Any] = {"path": path}
        if path == "cold":
            # False: a fresh agent folder (no snapshot here, e.g. another runner's session without
            # SERVICE_SNAPSHOT_URL); the conversation is kept either way.
            extra["workspaceRestored"] = restored
        owner = {"runner_id": self.deps.runner_id} if self.deps.runner_id is not None else {}
        self.row = yield from self._transition("active", "resumed", extra=extra,
                                               sandbox_id=self.handle.sandbox_id if self.handle else "", error=None,
                                               agent=row.agent_name if path == "warm" else None, **owner)
        self._after_answer(self.deps.count_resume, path, self.session_id, row.agent_name)
        view = session_json(self.row)
        if path == "cold":
            view["workspaceRestored"] = restored
        return view

    def _replace_lost_sandbox(self) -> Stage[None]:
        """An active session whose sandbox is gone (it died during the last turn, or since and its pool
        has not said so yet) comes back on a new one, as a cold resume would bring it back. The new
        sandbox is stored with a `resumed` event: the row names the sandbox whose workspace a restart
        after a kill rescues (`runtime._rescue_workspaces`), so it must be the live one."""
        yield from self._drop_sandbox()
        restored = yield from self._start_sandbox(resume_history=True, restore=True)
        assert self.handle is not None
        self.row = yield from self._transition(
            "active", "resumed", extra={"path": "cold", "reason": "sandbox_lost", "workspaceRestored": restored},
            sandbox_id=self.handle.sandbox_id)
        self.deps.count_resume("cold", self.session_id, self.row.agent_name)

    def _start_sandbox(self, *, resume_history: bool, restore: bool, agent: Any = None,
                       inserted: Inserted | None = None, then_here: bool = False) -> Stage[bool]:
        """Claim a sandbox, prepare its workspace and configure its bridge; the session holds it
        (`handle`, `conn`) only once it is ready, and a failure releases it. True when the workspace
        was restored from a snapshot. `then_here`: the caller's steps after this one may go on on the
        loop (`OnLoop.then_here`; `_then_here` says when)."""
        row = yield from self._row()
        deps = self.deps
        config = _config(row)
        if agent is None:
            agent = yield deps.resolve_agent(self.tenant, row.agent_name)
        network = bool(config.get("network", agent.network or deps.network_default))
        env: dict[str, str] = dict(agent.env or {})
        api_key = deps.fallback_api_key
        if row.credential_id:
            cred = yield deps.resolve_credential(self.tenant, row.credential_id)
            if cred.type == "anthropic":
                api_key = cred.secret  # never enters the sandbox: the model proxy adds it
            else:
                env.update(cred.env)
        env.update(deps.decrypt_env(row.env_ciphertext, row.id))
        for name in _ANTHROPIC_ENV:
            env.pop(name, None)
        seccomp = deps.seccomp_profile(self.tenant, row.agent_name)
        disk_mb = config.get("diskMb") or getattr(agent, "disk_mb", None)
        disk_bytes = int(disk_mb) * 1024 * 1024 if disk_mb else None
        spare: SandboxHandle | None = None
        if self._inline:  # on the loop (a create, `_inline_ok`): a spare taken there while the pool is idle
            pool_ref = getattr(deps.pool, "actor_ref", None)
            if pool_ref is not None:
                _, spare = call_inline(pool_ref, lambda pool: pool.claim_spare(
                    self.tenant, self.session_id, network, seccomp, disk_bytes))
        if spare is not None:
            claimed: Any = spare
        else:
            claim = deps.pool.claim(self.tenant, self.session_id, network, seccomp, disk_bytes)
            # On the loop the pool's answer is awaited; on this thread, waited for.
            claimed = (yield call(claim, deps.ask_timeout)) if self._inline else claim.get(timeout=deps.ask_timeout)
        if isinstance(claimed, Launching):  # no spare: the pool launches one off its thread
            try:
                claimed = yield claimed.handle
            except GeneratorExit:  # the actor stopped meanwhile: the sandbox is not ours to keep
                deps.pool.release(claimed.sandbox_id)
                raise
        handle: SandboxHandle = claimed
        try:
            binding = None
            if deps.model_proxy is not None:
                from ashd.sandboxing import ModelBinding, session_models

                # Who pays for the sandbox's model calls, and which models its turns may use. The key
                # never enters the sandbox: the model proxy adds it.
                binding = ModelBinding(self.session_id, self.tenant, row.agent_name,
                                       session_models(row.model, agent.model, agent.path, config),
                                       key=_constant(api_key))
            restored = False
            if self._inline and (restore or not small_agent(Path(agent.path), INLINE_COPY_ENTRIES,
                                                             INLINE_COPY_BYTES)):
                yield ON_ACTOR_THREAD  # a restore, or a copy that may take long, never on the loop
            try:
                if restore and deps.snapshots is not None:
                    restored = bool(deps.snapshots.restore(self.session_id, handle.paths.workspace)
                                                     .get(timeout=deps.ask_timeout))
                prepare_workspace(None if restored else Path(agent.path), handle.paths.workspace,
                                  None if restored else config.get("systemPrompt"),
                                  None if restored else config.get("mcpServers"),
                                  deps.sandbox_owner(handle.sandbox_id))
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                what = "workspace snapshot" if restore else "agent folder"
                raise DiskQuotaExceeded(
                    f"The session's {what} does not fit in its sandbox disk of {handle.disk_bytes // 1048576} "
                    "MiB; give the session (or the agent) a larger `diskMb`") from exc
            history: list[dict[str, Any]] = []
            if resume_history:
                from ashd.bridge.history import history_from_stored

                history = history_from_stored((yield deps.sessions.all_message_contents(self.session_id)))
            init = {
                "sessionId": self.session_id,
                "env": env,
                "model": row.model or agent.model,
                "permissionMode": config.get("permissionMode", "bypassPermissions"),
                "allowedTools": config.get("allowedTools"),
                "disallowedTools": config.get("disallowedTools"),
                "betas": config.get("betas"),
                "subagents": config.get("subagents"),
                "initialAgent": config.get("initialAgent"),
                "history": history,
                "runSetup": not restored,
                "setupTimeout": deps.setup_timeout,
                "setupLogLines": deps.setup_log_lines,
                "contextWindow": deps.context_window,
                "engine": deps.engine,
            }
            conn = yield OnLoop(self._connect_and_init(handle, init, binding, inserted),
                                timeout=deps.ask_timeout + deps.init_timeout, then_here=then_here)
        except Exception:
            yield from self._release(handle, None)
            raise
        except GeneratorExit:  # the actor stopped during the start: let the sandbox go, waiting for nothing
            self._release_now(handle)
            raise
        self.handle, self.conn = handle, conn
        deps.pool.mark_ready(handle.sandbox_id)
        return restored

    async def _connect_and_init(self, handle: SandboxHandle, init: dict[str, Any], binding: Any = None,
                                inserted: Inserted | None = None) -> Any:
        """One trip to the loop: the sandbox's log, the model proxy binding and socket, the bridge
        connection and its init."""
        from ashd.sandboxing import BridgeConnection

        # A new session's row may still be on its way (`create`): its lines are stored once it is.
        ready = None
        if inserted is not None and self.deps.session_logs is not None:
            ready = asyncio.wrap_future(inserted)
            ready.add_done_callback(_seen)  # its error is the create's answer, not the loop's to report
        if self.deps.session_logs is not None:  # from now on the sandbox's stderr is the session's
            # A spare's lines before its claim are the pool's; a sandbox started for this session may
            # have written its first ones already (it starts while the server connects).
            await self.deps.session_logs.attach(self.session_id, self.tenant, handle.paths.logs / "sandbox.log",
                                                ready, from_start=not handle.prewarmed)
        if binding is not None:
            self.deps.model_proxy.bind(handle.sandbox_id, binding)
        prepared = self.deps.warmer.take(handle.sandbox_id) if self.deps.warmer is not None else None
        conn = None
        if prepared is not None:
            try:
                conn = await prepared  # made while the sandbox waited in the pool
            except Exception:  # fall back to connecting now; the cause is logged below
                log.warning("prepared bridge connection failed; connecting again",
                            extra={"sandboxId": handle.sandbox_id}, exc_info=True)
        if conn is None:
            if self.deps.model_proxy is not None:
                await self.deps.model_proxy.start_for(handle.sandbox_id, handle.paths.model_socket)
            conn = await BridgeConnection.connect(str(handle.paths.bridge_socket), timeout=self.deps.ask_timeout)
        sink = None
        if self.deps.session_logs is not None:
            sink = self.deps.session_logs.setup_sink(self.session_id, self.tenant, self.deps.setup_log_lines, ready)
            conn.set_log_handler(sink)
        try:
            await conn.init(init, timeout=self.deps.init_timeout)
        except BaseException:
            await conn.close()
            raise
        finally:
            if sink is not None:  # every setup line is stored before the creation answers
                await sink.finish()
        return conn

    # --- pause / stop / delete -----------------------------------------------------------------
    @staged
    def pause(self) -> Stage[dict[str, Any] | Later[dict[str, Any]]]:
        """Pause now, or, while a turn runs, interrupt it and answer once the turn is stored and the
        session paused (an `active` session pauses, decisions.md): `end_turn` gives that answer."""
        yield from self._pausable_row()
        if self.turn is not None:
            waiter: Later[dict[str, Any]] = Later()
            self._pause_waiters.append(waiter)
            turn = self.turn
            # A turn whose sandbox a stop or a DELETE let go is ending by itself already.
            if len(self._pause_waiters) == 1 and turn.connection is self.conn:
                yield from self._interrupt(turn, "session paused")
            return waiter
        return (yield from self._pause_now())

    def _pausable_row(self) -> Stage[Session]:
        row = yield from self._row()
        if row.status != "active":
            raise BadRequest(f"Session is {row.status}; only an active session can be paused")
        return row

    def _pause_now(self) -> Stage[dict[str, Any]]:
        """Checked again: a stop may have come between a pause asked for during a turn and the turn's end."""
        yield from self._pausable_row()
        self.row = yield from self._transition("paused", "paused")
        if self.handle is not None and self.deps.snapshots is not None:
            # Off the request path, once the status is stored, in a quiet moment: the snapshot actor's
            # tar work would otherwise compete with this answer and the next requests for the interpreter.
            self._owe_snapshot(self.handle.paths.workspace)
        return session_json(self.row)

    def _owe_snapshot(self, workspace: Path, taken: concurrent.futures.Future[Any] | None = None) -> None:
        if self.deps.owe_snapshot is not None:
            self.deps.owe_snapshot(self.session_id, workspace, taken)
        else:
            self.deps.snapshots.snapshot_soon(self.session_id, workspace, taken)

    @staged
    def stop_session(self) -> Stage[dict[str, Any] | Later[dict[str, Any]]]:
        """Stop: the workspace snapshotted, the sandbox let go, `stopped` stored. A running turn is
        interrupted and its end awaited first (`_after_turn`), as a pause does: what its tools wrote
        until then is in the snapshot."""
        yield from self._stoppable_row()
        if self._turn_to_end_first():
            return (yield from self._after_turn("stop", "session stopped"))
        return (yield from self._stop_now())

    def _stoppable_row(self) -> Stage[Session]:
        row = yield from self._row()
        if row.status not in ("active", "starting"):
            raise BadRequest(f"Session is {row.status}; only an active or starting session can be stopped")
        return row

    def _stop_now(self) -> Stage[dict[str, Any]]:
        yield from self._stoppable_row()  # again: a pause or a DELETE may have come during the wait
        self._snapshot_before_end(strict=True)
        # The sandbox goes before the answer: a stop promises that its last lines are stored.
        return (yield from self._end("stopped", None, wait=True, sandbox_id=""))

    @staged
    def delete(self, keep_workspace: bool = True) -> Stage[dict[str, Any] | Later[dict[str, Any]]]:
        """End the session. `keep_workspace=False` (a purge follows) skips the final snapshot, and
        does not wait for a running turn's end as a DELETE that keeps the workspace does."""
        row = yield from self._row()
        if row.status == "ended":
            return session_json(row)
        if keep_workspace and self._turn_to_end_first():
            return (yield from self._after_turn("delete", "session deleted"))
        return (yield from self._delete_now(keep_workspace))

    def _delete_now(self, keep_workspace: bool) -> Stage[dict[str, Any]]:
        row = yield from self._row()
        if row.status == "ended":
            return session_json(row)
        if keep_workspace and self.turn is None and self.handle is not None and self.deps.snapshots is not None:
            return (yield from self._end_then_snapshot())
        skipped = self._snapshot_before_end(strict=False) if keep_workspace else None
        # The sandbox goes after the answer (its last log lines are stored a moment later).
        return (yield from self._end("ended", {"snapshot": skipped} if skipped else None, wait=False))

    def _turn_to_end_first(self) -> bool:
        """A turn runs in the sandbox a stop or a DELETE is about to snapshot and let go. (A turn whose
        sandbox was let go already is ending by itself, and writes to no workspace of this session.)"""
        return self.turn is not None and self.conn is not None and self.turn.connection is self.conn

    def _after_turn(self, kind: str, reason: str) -> Stage[Later[dict[str, Any]]]:
        """Interrupt the running turn and answer the stop or DELETE (`kind`) once it has ended and is
        stored (`end_turn`): a snapshot taken while the turn's tools still ran would miss what they
        wrote between it and the sandbox's end. Bounded: a turn not ended `shutdown_grace` seconds
        after the interrupt is cut short by letting its sandbox go, as before (`_turn_overdue`)."""
        waiter: Later[dict[str, Any]] = Later()
        self._ending.append((kind, waiter))
        if len(self._ending) == 1:
            turn = self.turn
            assert turn is not None
            yield from self._interrupt(turn, reason)
            self._ending_query = turn.query_id
            self._ending_bound = spawn_on_loop(self.deps.loop, self._bound_turn(turn.query_id),
                                               "bounding an interrupted turn's end")
        return waiter

    async def _bound_turn(self, query_id: str) -> None:
        await asyncio.sleep(self.deps.shutdown_grace)
        forget(Asker(self.actor_ref).turn_overdue(query_id), "ending an interrupted turn that did not end")

    @staged
    def turn_overdue(self, query_id: str) -> Stage[None]:
        """The interrupted turn `query_id` did not end within the grace: the stop or DELETE waiting
        for it goes on now, letting the sandbox go under the turn (whose end is then stored as cut
        short), after a snapshot of the workspace as it is."""
        if not self._ending or self._ending_query != query_id:
            return  # the turn ended in time
        log.warning("the interrupted turn did not end within %.0f s: the sandbox goes under it",
                    self.deps.shutdown_grace, extra={"sessionId": self.session_id})
        yield from self._finish_ending()

    def _finish_ending(self) -> Stage[None]:
        """Answer the stops and DELETEs that waited for the turn: each kind done once, a stop before
        a DELETE (which may follow it: a stopped session can be deleted, not the other way round)."""
        yield ON_ACTOR_THREAD  # a snapshot and a sandbox's release wait for other actors
        ending, self._ending = self._ending, []
        if self._ending_bound is not None:
            self._ending_bound.cancel()
            self._ending_bound = None
        for kind, now in (("stop", self._stop_now), ("delete", lambda: self._delete_now(True))):
            waiters = [waiter for k, waiter in ending if k == kind]
            if not waiters:
                continue
            try:
                view = yield from now()
            except Exception as exc:  # noqa: BLE001 - each waiting request gets the error as its answer
                for waiter in waiters:
                    waiter.set_exception(exc)
            else:
                for waiter in waiters:
                    waiter.set_result(view)

    def _end_then_snapshot(self) -> Stage[dict[str, Any]]:
        """DELETE with no turn running: `ended` is stored and answered at once, and the workspace's
        final snapshot is taken after the answer (in a quiet moment, or before any read of the
        session's files: `SnapshotActor.snapshot_soon`); the sandbox, and the workspace with it, go
        only once that snapshot is stored. A restart after a kill in between finds the workspace and
        snapshots it (`runtime._rescue_workspaces`). A workspace over SERVICE_SNAPSHOT_MAX_MB is
        found by a walk before the answer, which says so in the `ended` event, as before."""
        assert self.handle is not None
        workspace = self.handle.paths.workspace
        try:
            # On the loop (`_inline_ok`) only a small tree is walked; a larger one on this actor's thread.
            if not check_fits(workspace, self.session_id, self.deps.snapshot_max_bytes,
                              max_entries=INLINE_WALK_ENTRIES if self._inline else None):
                yield ON_ACTOR_THREAD
                check_fits(workspace, self.session_id, self.deps.snapshot_max_bytes)
            too_large = None
        except SnapshotTooLarge as exc:
            too_large = exc.message
        except OSError:
            too_large = None  # the snapshot itself says what is wrong with the tree
        self.row = yield from self._transition("ended", "ended", extra={"snapshot": too_large} if too_large else None)
        if too_large is not None:
            self._drop_sandbox_soon()
            return session_json(self.row)
        taken: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._owe_snapshot(workspace, taken)
        self._drop_sandbox_soon(after=taken)
        return session_json(self.row)

    def _end(self, status: str, extra: dict[str, Any] | None, *, wait: bool, **values: Any) -> Stage[dict[str, Any]]:
        """Store `status` (stopped, ended) and let the sandbox go, before the answer or (not `wait`)
        after it. With no turn running the status is stored first: a write that fails (a full disk,
        the database away) leaves the session as it was, its sandbox with it. A running turn's
        bridge goes first, so that the turn ends, interrupted and stored, before the status."""
        self._let_go_why = status
        if self.turn is not None:
            yield from self._drop_sandbox()
            self.row = yield from self._transition(status, status, extra=extra, **values)
            return session_json(self.row)
        self.row = yield from self._transition(status, status, extra=extra, **values)
        if wait:
            yield from self._drop_sandbox()
        else:
            self._drop_sandbox_soon()
        return session_json(self.row)

    @staged
    def sandbox_lost(self, lost: SandboxLost) -> Stage[None]:
        if self.handle is None or self.handle.sandbox_id != lost.sandbox_id:
            return
        log_file = self.handle.paths.logs / "sandbox.log"
        self.handle = None
        self._let_go_why = f"lost: {lost.detail}"
        conn, self.conn = self.conn, None
        if conn is not None:
            spawn_on_loop(self.deps.loop, conn.close(), "closing a lost sandbox's bridge connection")
        if self.deps.session_logs is not None:  # its last lines (why it died, say) are still readable
            spawn_on_loop(self.deps.loop, self.deps.session_logs.detach(self.session_id, log_file),
                          "storing a lost sandbox's last log lines")
        proxy = self.deps.model_proxy
        if proxy is not None:  # the socket goes, and the calls it still answered are stored
            spawn_on_loop(self.deps.loop, proxy.stop_for(lost.sandbox_id), "detaching a lost sandbox's model proxy")
        if (yield from self._row()).status == "active" and self.turn is None:
            self.row = yield from self._transition("paused", "paused", extra={"reason": lost.reason.value,
                                                                             "detail": lost.detail})

    # --- turns ---------------------------------------------------------------------------------
    @staged
    def begin_turn(self, content: Any, model: str | None, attachments: Sequence[dict[str, Any]] = (),
                   send_query: SendQuery | None = None) -> Stage[TurnTicket]:
        row = yield from self._shared_row()
        if row.status == "ended":  # resume answers 410 for it: point at what works
            raise BadRequest("Session is ended; create a new session")
        if row.status != "active":
            raise BadRequest(f"Session is {row.status}; resume it before sending messages")
        if self.turn is not None:
            raise Conflict("A turn is already running")
        handle = self.handle
        if handle is None or self.conn is None or handle.hold is None or not handle.hold():
            yield ON_ACTOR_THREAD  # what follows may ask the pool: never from the loop (`_inline_ok`)
            if self.handle is None or self.conn is None or not self._hold_sandbox():
                # The sandbox died between turns: bring the session back on a new one, transparently.
                yield from self._replace_lost_sandbox()
                self._hold_sandbox()
        assert self.handle is not None
        live_config, self._live_changes = self._live_changes, None
        meter = self.handle.meter
        ticket = TurnTicket(self.session_id, self.tenant, row.agent_name, self.handle.sandbox_id,
                            "q-" + uuid.uuid4().hex[:12], self.conn, model or row.model, time.monotonic(),
                            meter=meter, live_config=live_config)
        sent: SentQuery | None = None
        # The sandbox's CPU counter at the turn's start, read once the query is on its way where it
        # goes with the prompt's write: a cold read of the cgroup file took 0.05-0.07 ms of the path to
        # the bridge, and the bridge has not woken by then (its wake-up alone takes longer; the turn's
        # CPU is counted in ms). Elsewhere the query is sent after this step, which reads it last.
        cpu: list[float | None] = []

        def read_cpu() -> None:
            cpu.append(meter.cpu_seconds() if meter else None)

        def send_first(held: bool = False) -> None:
            nonlocal sent
            assert send_query is not None
            sent = send_query(ticket, held)
            read_cpu()

        # The query goes first where the prompt's write starts here on the loop, where the bridge
        # connection lives, and the bridge works on it while the write commits. Where the write runs
        # here at once (SQLite's, the query sent inside its transaction), nothing else runs on the loop
        # until it committed or failed, so no model call is admitted before the prompt is stored. Where
        # it is awaited instead (PostgreSQL's; SQLite's on the writer's thread while another writer
        # holds the database), the query goes `held`: the model proxy forwards none of the turn's calls
        # until the prompt is stored (`admit`). A failure withdraws the query first either way.
        here = send_query is not None and _on_loop(self.deps.loop)
        storing = self.deps.sessions.begin_turn_soon(self.session_id, self.tenant, content, attachments, EVENT_BLOCK,
                                                     before=send_first if here else None)
        held = here and sent is None and not (isinstance(storing, concurrent.futures.Future) and storing.done())
        if held:
            send_first(held=True)
        try:
            _, first_event = yield storing
        except Exception:
            if self._live_changes is None:  # the next turn takes them
                self._live_changes = live_config
            if self._execs == 0:  # no turn holds the sandbox
                self._let_sandbox_wait()
            if sent is not None:
                yield _withdrawn(sent)  # the engine leaves the query out of its conversation
            raise
        if held and sent is not None:  # the model proxy forwards its calls from now on
            if _on_loop(self.deps.loop):
                sent.admit()
            else:  # after SQLite's writer thread, the rest of this runs on this actor's
                self.deps.loop.call_soon_threadsafe(sent.admit)
        if not cpu:  # no query sent with the prompt's write (not started here on the loop)
            read_cpu()
        self._turn_since_row = True  # the user message moved lastActiveAt: a view reads the row again
        self.turn = dataclasses.replace(ticket, first_event=first_event, sent=sent is not None,
                                        cpu_at_start=cpu[0])
        return self.turn

    # --- live config ---------------------------------------------------------------------------
    @staged
    def configure(self, changes: dict[str, Any]) -> Stage[dict[str, Any]]:
        """PATCH .../config: store the changed model, tools, betas or subagents (a null clears one).
        They apply from the next turn (a running turn keeps what it started with): a live bridge
        gets them with its next query, a new sandbox (cold resume) with its init."""
        row = yield from self._row()
        if row.status == "ended":
            raise Gone("Session has ended; its config can no longer change. Create a new session")
        if row.status == "starting":
            raise Conflict("Session is still starting; change its config once it is active")
        config = _config(row)
        model = row.model
        for key, value in changes.items():
            if key == "model":
                model = value
            elif value is None:
                config.pop(key, None)
            else:
                config[key] = value
        initial, subagents = config.get("initialAgent"), config.get("subagents")
        if initial is not None and (not isinstance(subagents, dict) or initial not in subagents):
            known = ", ".join(sorted(subagents)) if isinstance(subagents, dict) and subagents else "none"
            raise BadRequest(f"`initialAgent` {initial!r} must name one of the session's `subagents` ({known}); "
                             "change `initialAgent` (or clear it with null) together with `subagents`")
        self.row = yield self.deps.sessions.update_config(self.session_id, self.tenant, model, config)
        if self.conn is not None:
            yield from self._send_later(changes, config)
        return session_json(self.row)

    def _send_later(self, changes: dict[str, Any], config: dict[str, Any]) -> Stage[None]:
        """Queue the changes for the live bridge, and let the model proxy allow the new models now."""
        row = yield from self._row()
        agent = None
        with contextlib.suppress(ServiceError):  # a deleted agent: the session works on, without its defaults
            agent = yield self.deps.resolve_agent(self.tenant, row.agent_name)
        pending = dict(self._live_changes or {})
        pending.update(changes)
        if "model" in changes:  # a cleared model falls back to the agent's, as at init
            pending["model"] = row.model or (agent.model if agent is not None else None)
        self._live_changes = pending
        proxy = self.deps.model_proxy
        if proxy is not None and self.handle is not None and agent is not None:
            from ashd.sandboxing import session_models

            models = session_models(row.model, agent.model, agent.path, config)
            yield _update_models(proxy, self.handle.sandbox_id, models)

    @staged
    def begin_exec(self, what: str = "running commands") -> Stage[Any]:
        """The live bridge connection for a command run through the API (not through the model).
        The sandbox is kept from eviction and the idle sweep until `end_exec`; one that died between
        turns is brought back first, as for a turn."""
        yield from self._hold_for(what)
        return self.conn

    @staged
    def let_go_why(self, conn: Any) -> Stage[str | None]:
        """None while `conn` is this session's bridge connection; else why the sandbox it reached
        went (`stopped`, `ended`, `lost: ...`), answered once the request letting it go is done."""
        if conn is self.conn:
            return None
        if self._let_go_why:
            return self._let_go_why
        row = yield from self._row()  # a new actor: the DELETE's, whose actor went with its answer
        return row.status if row.status in ("stopped", "ended") else "let go"

    @staged
    def end_exec(self) -> Stage[None]:
        yield from ()  # no loop work; staged so that it waits for the request running before it
        self._unhold()

    @staged
    def in_workspace(self, what: str, fn: Callable[[Path, tuple[int, int] | None], T]) -> Stage[T]:
        """`fn(workspace, owner)` in a worker thread on the live workspace (an API client's upload, a
        bundle restored), as one request of this actor: a stop, a pause or a DELETE that comes
        meanwhile waits for it, so the snapshot it takes holds what was written, and the workspace
        cannot go while `fn` writes into it. `owner`: the sandbox user, for what `fn` creates."""
        yield from self._hold_for(what)
        try:
            assert self.handle is not None
            work = asyncio.to_thread(fn, self.handle.paths.workspace, self.deps.sandbox_owner(self.session_id))
            result: T = yield OnLoop(work, timeout=self.deps.setup_timeout)
            return result
        finally:
            self._unhold()

    def _hold_for(self, what: str) -> Stage[None]:
        row = yield from self._row()
        if row.status == "ended":
            raise BadRequest("Session is ended; create a new session")
        if row.status != "active":
            raise BadRequest(f"Session is {row.status}; resume it before {what}")
        if self.handle is None or self.conn is None or not self._hold_sandbox():
            if self.turn is not None:  # the turn's own failure handling brings the sandbox back
                raise SandboxError("the session's sandbox is not running; try again after the running turn")
            yield from self._replace_lost_sandbox()
            self._hold_sandbox()
        self._execs += 1

    def _unhold(self) -> None:
        self._execs = max(0, self._execs - 1)
        if self._execs == 0 and self.turn is None and self.handle is not None:
            self._let_sandbox_wait()

    @staged
    def end_turn(self, query_id: str, row: Session | None = None) -> Stage[None]:
        if self.turn is None or self.turn.query_id != query_id:
            return
        self.turn = None
        if self.handle is not None and self._execs == 0:
            self._let_sandbox_wait()
        # lastActiveAt and the counts changed in storage, not the status: a pause right after the turn
        # decides on the row it has (its transition returns the new one). A view reads it again,
        # unless the turn's last batch returned it (`row`) and nothing else was stored about the
        # session since this actor's row (a config change, a transition: both move updated_at).
        if row is not None and self.row is not None and row.updated_at == self.row.updated_at:
            self.row = row
            self._turn_since_row = False
        else:
            self._turn_since_row = True
        # The interrupted turn is stored: a stop or a DELETE asked for meanwhile happens now, then a
        # pause (refused once either did). Waiters stay listed until answered, so that an actor that
        # stops meanwhile answers them (`_abandon_waiters`).
        if self._ending:
            yield from self._finish_ending()
        if self._pause_waiters:
            try:
                view = yield from self._pause_now()
            except Exception as exc:  # noqa: BLE001 - each waiting request gets the error as its answer
                waiters, self._pause_waiters = self._pause_waiters, []
                for waiter in waiters:
                    waiter.set_exception(exc)
            else:
                waiters, self._pause_waiters = self._pause_waiters, []
                for waiter in waiters:
                    waiter.set_result(view)

    @staged
    def interrupt(self) -> Stage[dict[str, Any]]:
        if self.turn is None:
            raise Conflict("No turn is running")
        turn = self.turn
        if turn.connection is self.conn:
            yield from self._interrupt(turn, None)
        return {"ok": True, "sessionId": self.session_id}

    def _interrupt(self, turn: TurnTicket, reason: str | None) -> Stage[None]:
        """Ask the bridge to interrupt `turn` (its stream ends `interrupted[: reason]`); its end, stored,
        comes as `end_turn`. A bridge gone meanwhile ends the turn with it, the same way."""
        try:
            yield turn.connection.interrupt(turn.query_id, reason=reason)
        except SandboxError:
            log.debug("interrupt (%s) not sent", reason or "asked for", exc_info=True,
                      extra={"sessionId": self.session_id})

    def workspace(self) -> Path | None:
        """The live workspace when this session has a sandbox, else None (use the snapshot)."""
        return self.handle.paths.workspace if self.handle is not None else None

    @staged
    def retirable(self) -> Stage[bool]:
        """True when this actor holds nothing once the requests before this one are done: no sandbox,
        no turn, no request after it (its thread can be let go)."""
        yield from ()
        return self._holds_nothing()

    def _holds_nothing(self) -> bool:
        # A command whose sandbox a stop let go still asks this actor why (`let_go_why`), then ends.
        return self.handle is None and self.turn is None and self._execs == 0 and not self.waiting()

    @staged
    def retire(self) -> Stage[bool]:
        """Stop this actor if it holds nothing once the requests before this one are done: no
        sandbox, no turn, no request after it (its thread can be let go). True when it stops: at
        once, from its own thread, so that a request after this one finds it stopped, unhandled."""
        yield from ()
        if self._holds_nothing():
            self.retire_when_idle()
            return True
        return False

    def running_turn(self) -> str | None:
        return self.turn.query_id if self.turn else None

    # --- helpers -------------------------------------------------------------------------------
    def _transition(self, status: str, action: str, extra: dict[str, Any] | None = None,
                    **values: Any) -> Stage[Session]:
        before = self.row.status if self.row is not None else None
        # On a runner, a write that does not claim the session is fenced: if the session was resumed
        # on another runner while this one was thought dead, this actor's view is stale.
        fence = self.deps.runner_id if "runner_id" not in values else None
        try:
            row: Session = yield self.deps.sessions.transition_soon(self.session_id, self.tenant, status, action,
                                                                    extra=extra, fence=fence, **values)
        except SessionHeldElsewhere:
            log.warning("session resumed on another runner meanwhile: letting this runner's sandbox go",
                        extra={"sessionId": self.session_id, "tenant": self.tenant})
            self.row = None  # the next request reads the row as it is
            yield from self._drop_sandbox()
            raise
        if self.deps.on_status is not None and before != status:
            # At once, not after the answer: the hooks that hear it are those there when it happened,
            # not one its client adds the moment the answer arrives.
            try:  # a status change stands whatever its listener does
                self.deps.on_status(self.tenant, self.session_id, row.agent_name, before, status, action, extra or {})
            except Exception:
                log.exception("status change listener failed", extra={"sessionId": self.session_id})
        self._after_answer(self._log_transition, action, status)
        return row

    def _log_transition(self, action: str, status: str) -> None:
        log.info("session %s", action, extra={"sessionId": self.session_id, "tenant": self.tenant,
                                               "status": status})

    def _after_answer(self, fn: Callable[..., None], *args: Any) -> None:
        """Bookkeeping the answer need not wait for (a log line, a metric).
        Handled on the loop (`_inline.py`), it runs as the loop's next callback: after the response
        is written, before the next request is read. On this actor's thread, at once (a callback
        there would wake the loop a second time)."""
        if asyncio._get_running_loop() is self.deps.loop:
            self.deps.loop.call_soon(fn, *args)
        else:
            fn(*args)

    def _fail(self, reason: str) -> Stage[None]:
        try:
            self.row = yield from self._transition("error", "error", extra={"reason": reason}, error=reason)
        except Exception:
            log.exception("could not record session error", extra={"sessionId": self.session_id})

    def _hold_sandbox(self) -> bool:
        """Mark the sandbox running for a turn or a command: False when it is gone. Held from this
        thread without asking the pool (a turn's start waited for the answer); when that finds it
        gone or being taken away, the pool is asked: it answers after the take-away, whose snapshot
        the session's restore then reads."""
        handle = self.handle
        assert handle is not None
        if handle.hold is not None and handle.hold():
            return True
        return bool(self.deps.pool.mark_running(handle.sandbox_id).get(timeout=self.deps.ask_timeout))

    def _let_sandbox_wait(self) -> None:
        """The sandbox's turn and commands are over: it is waiting again (evictable, idle-sweepable)."""
        handle = self.handle
        assert handle is not None
        if handle.unhold is not None:
            handle.unhold()
        else:
            self.deps.pool.mark_waiting(handle.sandbox_id)

    def _pool_alive(self, handle: SandboxHandle) -> bool:
        if handle.alive is not None:  # published by the pool with the claim: no ask
            return handle.alive()
        return bool(self.deps.pool.is_alive(handle.sandbox_id).get(timeout=self.deps.ask_timeout))

    def _snapshot_before_end(self, *, strict: bool) -> str | None:
        """Snapshot the live workspace before its sandbox goes; None when stored, else why not.

        A full disk refuses the request (StorageFull, 507): the sandbox and its workspace stay, so
        nothing is lost, and the same request works once space is back. A workspace over the
        snapshot limit refuses a stop (`strict`: the tenant can remove files and stop again) but
        not a delete, which asked for the session to go: its previous snapshot, if any, stays.
        """
        if self.handle is None or self.deps.snapshots is None:
            return None
        try:
            self.deps.snapshots.snapshot(self.session_id, self.handle.paths.workspace).get(
                timeout=self.deps.ask_timeout)
        except StorageFull:
            raise
        except SnapshotTooLarge as exc:
            if strict:
                raise
            return exc.message
        except Exception as exc:
            log.exception("snapshot at end failed", extra={"sessionId": self.session_id})
            return f"snapshot failed: {exc}"
        return None

    def _drop_sandbox(self) -> Stage[None]:
        """Let the session's sandbox go: it is no longer the session's from the first step on."""
        handle, conn = self.handle, self.conn
        self.handle, self.conn = None, None
        yield from self._release(handle, conn)

    def _drop_sandbox_soon(self, after: concurrent.futures.Future[Any] | None = None) -> None:
        """`_drop_sandbox` without waiting: the pool counts the sandbox gone now and stops it once
        the bridge was asked to shut down, its last log lines stored and its model proxy detached.
        With `after`, all of that waits until it is done (a DELETE's final snapshot, stored from the
        workspace the sandbox holds); the session holds the sandbox no more from now on either way."""
        handle, conn = self.handle, self.conn
        self.handle, self.conn = None, None
        self._live_changes = None
        if handle is not None and self.deps.warmer is not None:
            self.deps.warmer.discard(handle.sandbox_id)
        if conn is None and handle is None:
            return
        loop, pool, let_go = self.deps.loop, self.deps.pool, self._let_go

        def go(_: concurrent.futures.Future[Any] | None = None) -> None:  # `after`'s thread, or this one
            gone: concurrent.futures.Future[Any] = concurrent.futures.Future()
            if handle is not None:  # told first: the bridge's exit on its shutdown is then no crash
                _letting_go(handle)
                pool.release(handle.sandbox_id, after=gone)
            done = spawn_on_loop(loop, let_go(handle, conn), "letting a session's sandbox go")
            if done is None:
                gone.set_result(None)
            else:
                done.add_done_callback(lambda _: gone.set_result(None))

        if after is None:
            go()
        else:
            after.add_done_callback(go)

    def _release(self, handle: SandboxHandle | None, conn: Any) -> Stage[None]:
        self._live_changes = None  # the next sandbox's init reads the stored config
        if handle is not None and self.deps.warmer is not None:
            self.deps.warmer.discard(handle.sandbox_id)  # a preparation nobody took
        if conn is None and handle is None:
            return
        let_go: concurrent.futures.Future[None] = concurrent.futures.Future()
        if handle is not None:
            # The pool lets it go from now on and stops it once the steps below are done: a bridge
            # that exits on the shutdown request is not taken for one that crashed (a warning, its
            # workspace snapshotted again, a loss told to this session). Marked first as well: a
            # sweep the pool has queued before this release finds the exit no crash either.
            _letting_go(handle)
            self.deps.pool.release(handle.sandbox_id, after=let_go)
        try:
            # One stage on the loop for the three steps (each was a trip there and back of its own).
            yield OnLoop(self._let_go(handle, conn), timeout=self.deps.shutdown_grace + self.deps.ask_timeout)
        except Exception:
            log.warning("letting a sandbox go timed out", exc_info=True, extra={"sessionId": self.session_id})
        finally:
            let_go.set_result(None)

    async def _let_go(self, handle: SandboxHandle | None, conn: Any) -> None:
        """On the loop: ask the bridge to shut down, store the sandbox's last log lines, detach its
        model proxy. Each step is best effort; the pool's release that follows stops the sandbox."""
        if conn is not None:
            try:
                # One frame to send: a bridge that does not take it within the grace is stopped by the
                # pool's ladder that follows anyway.
                await asyncio.wait_for(conn.shutdown(), self.deps.shutdown_grace)
            except Exception:  # noqa: BLE001 - the ladder's signals follow anyway
                log.debug("bridge shutdown request failed", extra={"sessionId": self.session_id})
        if handle is None:
            return
        if self.deps.session_logs is not None:
            try:
                await self.deps.session_logs.detach(self.session_id)
            except StorageError as exc:  # a full data disk: the operator's outage, said without a traceback
                log.warning("could not store the sandbox's last log lines: %s", exc.message,
                            extra={"sessionId": self.session_id})
            except Exception:
                log.warning("could not store the sandbox's last log lines", exc_info=True,
                            extra={"sessionId": self.session_id})
        if self.deps.model_proxy is not None:
            try:
                await self.deps.model_proxy.stop_for(handle.sandbox_id)
            except Exception:  # noqa: BLE001 - the socket goes away with the sandbox dir anyway
                log.debug("model proxy detach failed", extra={"sandboxId": handle.sandbox_id})

    def _release_now(self, handle: SandboxHandle) -> None:
        if self.deps.warmer is not None:
            self.deps.warmer.discard(handle.sandbox_id)
        if self.deps.session_logs is not None:
            spawn_on_loop(self.deps.loop, self.deps.session_logs.detach(self.session_id),
                          "storing an abandoned sandbox's last log lines")
        if self.deps.model_proxy is not None:
            spawn_on_loop(self.deps.loop, self.deps.model_proxy.stop_for(handle.sandbox_id),
                          "detaching an abandoned sandbox's model proxy")
        self.deps.pool.release(handle.sandbox_id)

    def on_stop(self) -> None:
        super().on_stop()
        self._abandon_waiters()

    def on_failure(self, *exc_info: Any) -> None:
        super().on_failure(*exc_info)
        self._abandon_waiters()

    def _abandon_waiters(self) -> None:
        waiters = self._pause_waiters + [waiter for _, waiter in self._ending]
        self._pause_waiters, self._ending = [], []
        if self._ending_bound is not None:
            self._ending_bound.cancel()
        for waiter in waiters:
            # Not done: a new actor asked again answers from what is stored (the session ended, say).
            waiter.set_exception(ActorGone("the session's actor stopped before it was done; try again"))


async def _update_models(proxy: Any, sandbox_id: str, models: Any) -> None:
    proxy.update_models(sandbox_id, models)  # on the loop, which owns the proxy's bindings


def _constant(value: str | None) -> Any:
    return lambda: value


def _config(row: Session) -> dict[str, Any]:
    import json

    value = json.loads(row.config or "{}")
    return value if isinstance(value, dict) else {}


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs `loop` now (a request handled inline, `_inline.py`)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _letting_go(handle: SandboxHandle) -> None:
    if handle.letting_go is not None:  # a pool's handle (a test's fake has none)
        handle.letting_go()
