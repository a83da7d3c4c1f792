"""SessionRegistry: finds or starts the SessionActor of a session; the HTTP layer's entry point.

It lives on the event loop. Session rows are written here only at creation (in `starting`); from
then on the session's actor owns every transition.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from pykka import ActorRef

from ashd.actors._aio import ActorGone, Asker, Later, call, forget
from ashd.actors._inline import try_inline
from ashd.actors._pool_types import SandboxLost
from ashd.actors._session import SessionActor
from ashd.actors._session_deps import CreateRequest, SendQuery, SessionDeps, TurnTicket
from ashd.actors._staged import retire_soon, stop_soon
from ashd.errors import BadRequest, Conflict, Gone, SandboxError, Unavailable
from ashd.storage import AgentFile, Session, new_id, write_files

T = TypeVar("T")

log = logging.getLogger(__name__)

# Attempts of a request whose session's actor stopped before handling it (`_asking`).
ACTOR_ATTEMPTS = 3


def _cut_short(why: str) -> Conflict | SandboxError:
    """A command whose sandbox went while it ran: why, as its answer."""
    if why in ("stopped", "ended"):
        return Conflict(f"The session was {why} while the command ran, and its sandbox with it; the command's "
                        "output is lost")
    return SandboxError(f"the session's sandbox went while the command ran ({why}); the command's output is lost")


def outcome_of(task: asyncio.Future[T]) -> concurrent.futures.Future[T]:
    """`task`'s outcome for an actor's stage, as a future the actor takes at once when it is already
    resolved (no trip through the loop; an insert is long done when the sandbox's start is)."""
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def copy(done: asyncio.Future[T]) -> None:
        if done.cancelled():
            outcome.set_exception(Unavailable("the service is shutting down; try again"))
        elif done.exception() is not None:
            outcome.set_exception(cast(BaseException, done.exception()))
        else:
            outcome.set_result(done.result())

    task.add_done_callback(copy)
    return outcome


class SessionRegistry:
    def __init__(self, deps: SessionDeps) -> None:
        self.deps = deps
        self._actors: dict[str, ActorRef[SessionActor]] = {}
        self._tenants: dict[str, str] = {}  # session id -> owning tenant, checked on every lookup
        # The latest view of each live session, so GET answers without a trip to the actor or the
        # database. Every change goes through this registry, which refreshes or drops the entry;
        # `_epochs` keeps a slow read from storing a view older than a change made meanwhile.
        self._views: dict[str, dict[str, Any]] = {}
        self._epochs: dict[str, int] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._proxies: dict[str, tuple[ActorRef[SessionActor], Any]] = {}  # session id -> its actor's proxy
        self._lock = asyncio.Lock()

    def _proxy(self, session_id: str, ref: ActorRef[SessionActor]) -> Any:
        """The actor's method caller (`Asker`, not pykka's proxy: see there), made once per actor."""
        cached = self._proxies.get(session_id)
        if cached is not None and cached[0] is ref:
            return cached[1]
        proxy = Asker(ref)
        self._proxies[session_id] = (ref, proxy)
        return proxy

    @property
    def timeout(self) -> float:
        return self.deps.ask_timeout

    def _live(self, tenant: str, session_id: str) -> ActorRef[SessionActor] | None:
        """The session's running actor, only for its own tenant (another tenant's is not found)."""
        ref = self._actors.get(session_id)
        if ref is None or not ref.is_alive() or self._tenants.get(session_id) != tenant:
            return None
        return ref

    async def _asking(self, tenant: str, session_id: str, ask: Callable[[Any], Awaitable[T]]) -> T:
        """`await ask(proxy)` on the session's actor. One that stopped before it handled the request
        (a DELETE or a stop let it go meanwhile, from another client) answers nothing: the request
        is asked again of a new actor, which answers from what is stored (400 for a session that
        ended, a cold resume for one stopped), instead of a 503 for a race the client cannot see."""
        for attempt in range(ACTOR_ATTEMPTS):
            proxy = await self._actor(tenant, session_id)
            try:
                return await ask(proxy)
            except ActorGone:
                if attempt == ACTOR_ATTEMPTS - 1:
                    raise
            except (BadRequest, Gone):
                # Refused for the session's state: one that ended or stopped needs no actor, and a
                # client that keeps asking about it must not keep one (a thread) per session alive.
                self._retire_later(session_id)
                raise
        raise AssertionError("unreachable")

    async def _actor(self, tenant: str, session_id: str) -> Any:
        ref = self._live(tenant, session_id)
        if ref is None:
            # The row must exist and belong to the tenant before an actor is started for it.
            await self.deps.sessions.get(tenant, session_id)
            async with self._lock:
                ref = self._actors.get(session_id)
                if ref is None or not ref.is_alive():
                    ref = SessionActor.start(self.deps, session_id, tenant)
                    self._actors[session_id] = ref
                    self._tenants[session_id] = tenant
        return self._proxy(session_id, ref)

    async def create(self, req: CreateRequest, *, encrypted_env: bytes | None) -> dict[str, Any]:
        row = Session(id=req.session_id, tenant_id=req.tenant, agent_name=req.agent_name, model=req.model,
                      status="starting", config=json.dumps(req.config), credential_id=req.credential_id,
                      env_ciphertext=encrypted_env, runner_id=self.deps.runner_id)
        soon = self.deps.sessions.insert_soon(row)
        inserting: asyncio.Future[Session] | concurrent.futures.Future[Session]
        if isinstance(soon, concurrent.futures.Future):
            inserting = inserted = soon  # stored already, mostly (SQLite, free): no trip to the writer
            if soon.done() and soon.exception() is not None:
                raise cast(BaseException, soon.exception())  # nothing was stored: no actor, no sandbox
        else:
            inserting = asyncio.ensure_future(soon)
            await asyncio.sleep(0)  # the insert is on its way: the actor's thread starts beside it
            inserted = outcome_of(inserting)
        async with self._lock:
            ref = SessionActor.start(self.deps, req.session_id, req.tenant)
            self._actors[req.session_id] = ref
            self._tenants[req.session_id] = req.tenant
        try:
            # An insert still on its way goes on beside the sandbox's start; the actor waits for it
            # before it stores anything more. Creation may install packages and run setup.sh: its
            # budget includes the setup timeout.
            # Handled here, on the loop, as a warm resume is (`SessionActor._inline_ok`): the new
            # actor's thread is not even started unless a step needs it.
            return await self._changed(req.session_id,
                                       self._inline(req.session_id, "create", req, row, inserted)
                                       or self._proxy(req.session_id, ref).create(req, row, inserted),
                                       self.timeout + self.deps.init_timeout + 10)
        except BaseException:
            if inserting.done() and not inserting.cancelled() and inserting.exception() is not None:
                async with self._lock:  # nothing was stored: no actor either
                    if self._actors.get(req.session_id) is ref:
                        del self._actors[req.session_id]
                        self._tenants.pop(req.session_id, None)
                        self._proxies.pop(req.session_id, None)
                stop_soon(ref)
            raise

    async def fork(self, tenant: str, parent_id: str, child_id: str, encrypted_env: bytes | None) -> dict[str, Any]:
        """A new session from `parent_id`: its workspace (live, else its latest snapshot) and its
        conversation copied, its own sandbox started. Nothing is stored for the child until its
        snapshot exists, so a refused snapshot (413, 507) leaves no trace."""
        parent = await self.deps.sessions.get(tenant, parent_id)
        if parent.status == "starting":
            raise Conflict(f"Session {parent_id} is still starting; fork it once it is active")
        await self.deps.resolve_agent(tenant, parent.agent_name)  # 404 when the agent is gone
        snapshots = self.deps.snapshots
        if snapshots is not None:
            live = await self.workspace(tenant, parent_id)
            if live is not None and Path(live).is_dir():
                await call(snapshots.snapshot(child_id, Path(live)), self.timeout + 2 * self.deps.setup_timeout)
            else:
                await call(snapshots.copy_latest(parent_id, child_id), self.timeout + 2 * self.deps.setup_timeout)
        row = Session(id=child_id, tenant_id=tenant, agent_name=parent.agent_name, model=parent.model,
                      status="starting", config=parent.config, credential_id=parent.credential_id,
                      env_ciphertext=encrypted_env, runner_id=self.deps.runner_id)
        try:
            row = await self.deps.sessions.insert_fork(row, parent_id)
        except BaseException:
            if snapshots is not None:
                snapshots.delete(child_id)
            raise
        async with self._lock:
            ref = SessionActor.start(self.deps, child_id, tenant)
            self._actors[child_id] = ref
            self._tenants[child_id] = tenant
        self._remember(parent_id, None)
        return await self._changed(child_id, self._proxy(child_id, ref).start_fork(row),
                                   self.timeout + self.deps.init_timeout + 10)

    def _remember(self, session_id: str, view: dict[str, Any] | None, epoch: int | None = None) -> None:
        if epoch is not None and self._epochs.get(session_id, 0) != epoch:
            return  # something changed while this view was being read: do not cache it
        if epoch is None:
            self._epochs[session_id] = self._epochs.get(session_id, 0) + 1
        if view is None or session_id not in self._actors:
            self._views.pop(session_id, None)
        else:  # what a resume answered about this one start is not part of the session's view
            self._views[session_id] = {k: v for k, v in view.items() if k != "workspaceRestored"}

    async def _changed(self, session_id: str, fut: Any, timeout: float) -> dict[str, Any]:
        self._remember(session_id, None)
        # Kept only if nothing else changed meanwhile: a turn that ended while this answer was on its
        # way (a PATCH waiting behind it on the actor) stored a newer row than the one it shows.
        epoch = self._epochs[session_id]
        view: dict[str, Any] = await call(fut, timeout)
        self._remember(session_id, view, epoch)
        return view

    async def view(self, tenant: str, session_id: str) -> dict[str, Any]:
        cached = self._views.get(session_id)
        if cached is not None and self._tenants.get(session_id) == tenant:
            return cached
        epoch = self._epochs.get(session_id, 0)
        ref = self._live(tenant, session_id)
        if ref is not None:
            try:
                view: dict[str, Any] = await call(self._proxy(session_id, ref).view(), self.timeout)
            except Unavailable:  # let go meanwhile (a DELETE, a stop), or busy: what is stored is the view
                pass
            else:
                if view["tenantId"] == tenant:
                    self._remember(session_id, view, epoch)
                    return view
        from ashd.storage import session_json

        return session_json(await self.deps.sessions.get(tenant, session_id))

    async def pause(self, tenant: str, session_id: str) -> dict[str, Any]:
        # A running turn is interrupted and stored first: the answer waits for its end.
        timeout = 2 * self.timeout + self.deps.shutdown_grace
        return await self._asking(tenant, session_id, lambda proxy: self._changed(
            session_id, self._inline(session_id, "pause") or proxy.pause(), timeout))

    async def resume(self, tenant: str, session_id: str) -> dict[str, Any]:
        timeout = self.timeout + self.deps.init_timeout + 10
        return await self._asking(tenant, session_id, lambda proxy: self._changed(
            session_id, self._inline(session_id, "resume") or proxy.resume(), timeout))

    def _inline(self, session_id: str, name: str, *args: Any) -> Later[Any] | None:
        """The request handled here, on the loop, if the session's actor is idle and lets it
        (`_inline.py`): two crossings fewer, and its transaction runs on a warm thread."""
        self._remember(session_id, None)  # as `_changed` does before the request, inline or not
        ref = self._actors.get(session_id)
        return None if ref is None else try_inline(ref, name, *args)

    async def stop(self, tenant: str, session_id: str) -> dict[str, Any]:
        view = await self._asking(tenant, session_id, lambda proxy: self._changed(
            session_id, proxy.stop_session(), 2 * self.timeout + self.deps.shutdown_grace))
        await self._retire(session_id)
        return view

    async def _retire(self, session_id: str) -> None:
        """Stop the actor of a session that has no sandbox and no turn: one thread per live session,
        not per session ever seen. The next request for it starts a new actor from storage."""
        ref = self._actors.get(session_id)
        if ref is None or not ref.is_alive():
            return
        try:
            # The actor decides in its own turn, and stops there: a request that came after this
            # one finds it stopped and is asked again of a new actor (`_asking`), never cut short.
            retired = await call(try_inline(ref, "retire") or self._proxy(session_id, ref).retire(), self.timeout)
        except Unavailable:
            return
        if retired:
            async with self._lock:
                if self._actors.get(session_id) is ref:
                    del self._actors[session_id]
                    self._tenants.pop(session_id, None)
                    self._views.pop(session_id, None)
                    self._proxies.pop(session_id, None)

    async def delete(self, tenant: str, session_id: str, *, purge: bool = False) -> dict[str, Any]:
        """End the session. With `purge`, also delete its snapshots, messages and events: the
        record is gone afterwards (404), and what the tenant held for it is freed."""
        # `_inline` forgets the cached view first, whether it handles the request here or not.
        # A running turn is interrupted and stored first (but for a purge): the answer waits for its end.
        view: dict[str, Any] = await self._asking(tenant, session_id, lambda proxy: call(
            self._inline(session_id, "delete", not purge) or proxy.delete(not purge),
            2 * self.timeout + self.deps.shutdown_grace))
        ref = self._actors.pop(session_id, None)
        self._tenants.pop(session_id, None)
        self._views.pop(session_id, None)
        self._proxies.pop(session_id, None)
        self._epochs.pop(session_id, None)
        if ref is not None:
            # After the answer is written: the actor's thread, woken now, would take the interpreter
            # from the loop while it writes it (0.15 ms of a DELETE, measured; docs/performance.md).
            # Once idle: requests that came before this point are answered (400: the session ended).
            asyncio.get_running_loop().call_soon(retire_soon, ref)
        if purge:
            if self.deps.snapshots is not None:
                await call(self.deps.snapshots.delete(session_id), self.timeout)
            await self.deps.sessions.purge(tenant, session_id)
        return view

    async def configure(self, tenant: str, session_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        return await self._asking(tenant, session_id, lambda proxy: self._changed(
            session_id, proxy.configure(changes), self.timeout))

    async def interrupt(self, tenant: str, session_id: str) -> dict[str, Any]:
        return await self._asking(tenant, session_id, lambda proxy: call(proxy.interrupt(), self.timeout))

    async def begin_turn(self, tenant: str, session_id: str, content: Any, model: str | None,
                         attachments: Sequence[dict[str, Any]] = (), send_query: SendQuery | None = None,
                         ) -> TurnTicket:
        """`send_query`: sends the turn's query while its prompt is stored, where the turn starts on
        the loop (`SessionActor.begin_turn`); the ticket says whether it did (`sent`)."""
        # lastActiveAt moves with the user message: `_inline` forgets the cached view first.
        return await self._asking(tenant, session_id, lambda proxy: call(
            self._inline(session_id, "begin_turn", content, model, attachments, send_query)
            or proxy.begin_turn(content, model, attachments), self.timeout + self.deps.init_timeout))

    def end_turn(self, ticket: TurnTicket) -> None:
        self._remember(ticket.session_id, None)
        ref = self._actors.get(ticket.session_id)
        if ref is not None and ref.is_alive():
            forget(self._proxy(ticket.session_id, ref).end_turn(ticket.query_id), "ending a turn")

    async def end_turn_now(self, ticket: TurnTicket, row: Session | None = None) -> None:
        """`end_turn`, answered: by then the session has told the pool its sandbox waits again, so
        whatever a client does once it has the turn's `done` (a resume that needs the room) reaches
        the pool after that (one mailbox, in order). `row`: the session's row as the turn's last
        batch left it, which the actor keeps instead of reading it again for the next view."""
        ref = self._actors.get(ticket.session_id)
        if ref is not None and ref.is_alive():
            with contextlib.suppress(Unavailable):  # on the loop when the actor is idle (`_inline`)
                await call(self._inline(ticket.session_id, "end_turn", ticket.query_id, row)
                           or self._proxy(ticket.session_id, ref).end_turn(ticket.query_id, row), self.timeout)
        else:
            self._remember(ticket.session_id, None)

    async def exec(self, tenant: str, session_id: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
        """Run a program in the session's sandbox, as the engine's Bash tool runs one: same isolation,
        same output caps. Returns the bridge's `{exitCode, stdout, stderr[, timedOut]}`."""
        async def begin(proxy: Any) -> tuple[Any, Any]:
            return proxy, await call(proxy.begin_exec(), self.timeout + self.deps.init_timeout)

        proxy, conn = await self._asking(tenant, session_id, begin)
        why: str | None = None

        async def let_go_why() -> str | None:  # asked behind the request that may be letting it go
            return await self._asking(tenant, session_id, lambda proxy: call(proxy.let_go_why(conn), self.timeout))

        try:
            try:
                frame = await conn.exec(argv, timeout=timeout_s)
            except SandboxError:  # the sandbox went while the command ran: say why
                why = await let_go_why()
                if why is None:
                    raise
                raise _cut_short(why) from None
            code = frame.get("exitCode")
            if isinstance(code, int) and code < 0 and not frame.get("timedOut"):
                # Killed by a signal: by the bridge's shutdown, when a stop or a DELETE let it go.
                why = await let_go_why()
                if why in ("stopped", "ended"):
                    raise _cut_short(why)
        finally:
            forget(proxy.end_exec(), "ending a command")
            if why is not None:  # a stop let the sandbox go, and kept the actor for this answer
                self._retire_later(session_id)
        return {k: v for k, v in frame.items() if k in ("exitCode", "stdout", "stderr", "timedOut")}

    async def in_live_workspace(self, tenant: str, session_id: str, what: str,
                                fn: Callable[[Path, tuple[int, int] | None], T]) -> T:
        """Run `fn(workspace, owner)` in a thread on the session's live workspace for an API client
        (`what` it does names it in errors). The sandbox is held as for exec, so it is not evicted or
        swept meanwhile; `owner` is the sandbox user, for what `fn` creates."""
        timeout = self.timeout + self.deps.init_timeout + self.deps.setup_timeout
        result: T = await self._asking(tenant, session_id, lambda proxy: call(proxy.in_workspace(what, fn), timeout))
        return result

    async def write_files(self, tenant: str, session_id: str, target: str, files: list[AgentFile]) -> list[str]:
        """Write files into the session's live workspace, owned by the sandbox user."""
        return await self.in_live_workspace(tenant, session_id, "uploading files",
                                            lambda ws, owner: write_files(ws, target, files, owner))

    async def running_turn(self, tenant: str, session_id: str) -> str | None:
        ref = self._live(tenant, session_id)
        if ref is None:
            return None
        try:
            turn: str | None = await call(self._proxy(session_id, ref).running_turn(), self.timeout)
        except ActorGone:  # let go meanwhile: an actor with a turn is not
            return None
        return turn

    async def workspace(self, tenant: str, session_id: str) -> Any:
        await self.deps.sessions.get(tenant, session_id)
        ref = self._live(tenant, session_id)
        if ref is None:
            return None
        try:
            return await call(self._proxy(session_id, ref).workspace(), self.timeout)
        except ActorGone:  # let go meanwhile, its sandbox with it: the snapshot is the workspace
            return None

    def on_sandbox_lost(self, lost: SandboxLost) -> None:
        """Told by the pool (from its thread); forwarded to the session's actor with `tell`."""
        self._remember(lost.session_id, None)
        ref = self._actors.get(lost.session_id)
        if ref is not None and ref.is_alive():
            forget(self._proxy(lost.session_id, ref).sandbox_lost(lost), "telling a session its sandbox is lost")
            self._retire_later(lost.session_id)

    def _retire_later(self, session_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._retire(session_id))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def running_count(self) -> int:
        busy = 0
        for session_id, ref in list(self._actors.items()):
            if not ref.is_alive():
                continue
            try:
                if await call(self._proxy(session_id, ref).running_turn(), self.timeout):
                    busy += 1
            except ActorGone:  # retired meanwhile: an actor with a turn is not
                continue
        return busy

    def live_sessions(self) -> list[tuple[str, str]]:
        """(tenant, session id) of every session with a running actor here."""
        return [(self._tenants[sid], sid) for sid, ref in list(self._actors.items())
                if ref.is_alive() and sid in self._tenants]

    def live_actors(self) -> int:
        return sum(1 for ref in self._actors.values() if ref.is_alive())

    async def stop_all(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        refs = list(self._actors.values())
        self._actors.clear()
        self._proxies.clear()
        self._tenants.clear()
        for ref in refs:
            if ref.is_alive():
                stop_soon(ref)

    def new_session_id(self) -> str:
        return new_id()
