"""`RoutingBackend`: a coordinator's `SessionBackend`, which sends each session to its runner.

Create goes to the alive runner with the most free capacity (`RunnerRegistryActor.pick`); every
later call for a session goes to the runner named by the session's `runner_id` in the shared
database, never by this coordinator's memory, so any coordinator serves any session. Sessions never
move while their runner is alive. A session whose runner is gone can be resumed: cold, on the best
alive runner (its workspace from SERVICE_SNAPSHOT_URL when set, else a fresh agent folder; the
answer says `workspaceRestored`). Without an alive runner the coordinator's local backend serves
(SERVICE_COORDINATOR_LOCAL), or else the call is refused with 503. Replay reads the shared database.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ashd.actors import RunnerInfo, call
from ashd.backends._protocol import Bundle, Files, Frame, Message, NewSession, SessionBackend, SessionView, Turn
from ashd.backends._remote import RemoteBackend, RunnerClient, RunnerDidNotTake
from ashd.backends._replay import stored_replay
from ashd.errors import Unavailable
from ashd.storage import AgentFile, Session, Sessions, session_json

log = logging.getLogger(__name__)
T = TypeVar("T")
NO_RUNNERS = ("No runners are available and no local backend is configured: start a runner (`ashd runner`) "
              "registered with this coordinator, or set SERVICE_COORDINATOR_LOCAL=true")
# A create (or a cold resume elsewhere) that a runner refuses with 503 goes to the next best one,
# this many times in all.
_PLACE_ATTEMPTS = 3


class RoutingBackend:
    def __init__(self, sessions: Sessions, registry: Any, client: RunnerClient, local: SessionBackend | None,
                 timeout: float, *, local_runner_id: str | None = None) -> None:
        self._sessions = sessions
        self._registry = registry  # RunnerRegistryActor proxy
        self._client = client
        self._local = local
        # The local backend's runner id (SERVICE_COORDINATOR_LOCAL registers the pool as a runner):
        # this coordinator reaches its own sessions directly, the others through its runner API.
        self._local_runner_id = local_runner_id
        self._timeout = timeout
        self._remotes: dict[tuple[str, str], RemoteBackend] = {}
        self._streams = 0  # turns this coordinator is relaying (graceful shutdown waits for them)

    # --- where a session goes ------------------------------------------------------------------
    def _remote(self, runner: RunnerInfo) -> SessionBackend:
        if self._local is not None and runner.runner_id == self._local_runner_id:
            return self._local
        key = (runner.runner_id, runner.address)
        backend = self._remotes.get(key)
        if backend is None:
            backend = self._remotes[key] = RemoteBackend(self._client, runner.runner_id, runner.address)
        return backend

    async def _pick(self, exclude: frozenset[str] = frozenset()) -> SessionBackend:
        """Where a new session (or one whose runner is gone) goes: the best alive runner, else local."""
        runner: RunnerInfo | None = await call(self._registry.pick(exclude), self._timeout)
        if runner is not None:
            return self._remote(runner)
        if self._local is not None:
            return self._local
        raise Unavailable(NO_RUNNERS)

    async def _home(self, row: Session) -> SessionBackend | None:
        """The backend the session lives on, when it is there: its runner while alive, or the local
        backend for a session without a runner. None: its runner is gone."""
        if row.runner_id is None:
            # From before local pools registered as runners: only its own coordinator has its sandbox
            # (another one's would be a second sandbox with a diverging workspace).
            return self._local if row.owner_id == self._local_runner_id else None
        if self._local is not None and row.runner_id == self._local_runner_id:
            return self._local
        runner: RunnerInfo | None = await call(self._registry.address(row.runner_id), self._timeout)
        return self._remote(runner) if runner is not None else None

    async def _session(self, tenant: str, session_id: str) -> tuple[Session, SessionBackend | None]:
        row = await self._sessions.get(tenant, session_id)  # 404 for unknown or other tenant
        return row, await self._home(row)

    async def _anywhere(self, tenant: str, session_id: str) -> SessionBackend:
        """For calls that need no live sandbox (end, pause, stop, files from the snapshot): the
        session's own backend, or any that can read it from the shared database and snapshot store."""
        _, home = await self._session(tenant, session_id)
        return home if home is not None else await self._pick()

    async def _via(self, where: Callable[[], Awaitable[SessionBackend]],
                   op: Callable[[SessionBackend], Awaitable[T]]) -> T:
        """`op` on the backend `where` names. A runner that took no connection may be one this
        coordinator's registry copy still lists though it left through another coordinator (a drain
        deregisters through the load balancer): read the registry again and, when it now names
        another backend, go there once. A runner still registered keeps its 503."""
        backend = await where()
        try:
            return await op(backend)
        except RunnerDidNotTake:
            if not isinstance(backend, RemoteBackend):
                raise
            self._registry.forget()
            fresh = await where()
            if fresh is backend:
                raise
            return await op(fresh)

    async def _live(self, tenant: str, session_id: str) -> SessionBackend:
        """For calls that need the session's sandbox: its own backend only. A session whose runner is
        gone is not silently restarted elsewhere: an inactive one gets the usual refusal, an active
        one a 503 saying to resume it."""
        row, home = await self._session(tenant, session_id)
        if home is not None:
            return home
        if row.status not in ("active", "starting"):
            return await self._pick()  # any backend answers "Session is paused; resume it ..."
        where = f"runner {row.runner_id}" if row.runner_id else f"the local pool of coordinator {row.owner_id}"
        raise Unavailable(f"Session {session_id} runs on {where}, which is not available; resume "
                          f"it (POST /api/sessions/{session_id}/resume) to continue on another runner")

    # --- lifecycle -----------------------------------------------------------------------------
    async def create(self, new: NewSession) -> SessionView:
        # Only a runner that never took the request (unreachable, draining, or full at the door) is
        # passed over: one that broke off while creating, or found no room after it stored the session,
        # may have stored it, so the same id cannot go elsewhere.
        return await self._placed(lambda backend: backend.create(new), RunnerDidNotTake)

    async def _placed(self, start: Callable[[SessionBackend], Awaitable[SessionView]],
                      retry_on: type[Unavailable] = Unavailable) -> SessionView:
        """Start a session on the best runner; one that refuses with `retry_on` (unreachable or
        draining; for a resume also full) is left out and the next best tried, a few times in all."""
        tried: frozenset[str] = frozenset()
        last: Unavailable | None = None
        for attempt in range(_PLACE_ATTEMPTS):
            try:
                backend = await self._pick(tried)
            except Unavailable:
                if last is not None:  # the runners there are all refused: say why, naming the last one
                    raise last from None
                raise
            try:
                return await start(backend)
            except retry_on as exc:
                if not isinstance(backend, RemoteBackend) or attempt == _PLACE_ATTEMPTS - 1:
                    raise
                log.warning("runner refused a new session; trying another: %s", exc.message,
                            extra={"runnerId": backend.runner_id})
                last = exc
                tried = tried | {backend.runner_id}
                self._registry.forget()
        raise AssertionError("unreachable")

    async def view(self, tenant: str, session_id: str) -> SessionView:
        row, home = await self._session(tenant, session_id)
        if home is self._local and home is not None:
            return await home.view(tenant, session_id)
        return session_json(row)  # the shared database is the truth: no trip to the runner

    async def resume(self, tenant: str, session_id: str) -> SessionView:
        for fresh in (False, True):
            _, home = await self._session(tenant, session_id)
            if home is None:
                break
            try:
                return await home.resume(tenant, session_id)
            except RunnerDidNotTake:
                # Maybe gone though this coordinator's registry copy still lists it (see `_via`).
                if fresh or not isinstance(home, RemoteBackend):
                    raise
                self._registry.forget()
        # Its runner is gone: a cold start on the best alive runner, which stamps itself on the session.
        return await self._placed(lambda backend: backend.resume(tenant, session_id))

    async def pause(self, tenant: str, session_id: str) -> SessionView:
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.pause(tenant, session_id))

    async def stop(self, tenant: str, session_id: str) -> SessionView:
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.stop(tenant, session_id))

    async def end(self, tenant: str, session_id: str, *, purge: bool = False) -> SessionView:
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.end(tenant, session_id, purge=purge))

    async def configure(self, tenant: str, session_id: str, changes: dict[str, Any]) -> SessionView:
        # Its own runner while it is alive (a live bridge gets the changes with its next query), else
        # any: the stored config is what a later resume starts with.
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.configure(tenant, session_id, changes))

    async def interrupt(self, tenant: str, session_id: str) -> dict[str, Any]:
        return await self._via(lambda: self._live(tenant, session_id),
                               lambda b: b.interrupt(tenant, session_id))

    async def fork(self, tenant: str, parent_id: str, child_id: str, encrypted_env: bytes | None) -> SessionView:
        # The child starts where the parent's workspace is (live there, else its snapshot anywhere).
        return await self._via(lambda: self._anywhere(tenant, parent_id),
                               lambda b: b.fork(tenant, parent_id, child_id, encrypted_env))

    async def exec(self, tenant: str, session_id: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
        return await self._via(lambda: self._live(tenant, session_id),
                               lambda b: b.exec(tenant, session_id, argv, timeout_s))

    async def write_files(self, tenant: str, session_id: str, target: str, files: list[AgentFile]) -> list[str]:
        return await self._via(lambda: self._live(tenant, session_id),
                               lambda b: b.write_files(tenant, session_id, target, files))

    async def bundle(self, tenant: str, session_id: str) -> Bundle:
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.bundle(tenant, session_id))

    async def restore_bundle(self, tenant: str, session_id: str, data: bytes) -> tuple[int, list[str]]:
        return await self._via(lambda: self._live(tenant, session_id),
                               lambda b: b.restore_bundle(tenant, session_id, data))

    async def files(self, tenant: str, session_id: str) -> Files:
        return await self._via(lambda: self._anywhere(tenant, session_id),
                               lambda b: b.files(tenant, session_id))

    # --- turns ---------------------------------------------------------------------------------
    async def message(self, tenant: str, session_id: str, message: Message) -> Turn:
        turn = await self._via(lambda: self._live(tenant, session_id),
                               lambda b: b.message(tenant, session_id, message))
        return _Counted(turn, self)

    async def replay(self, tenant: str, session_id: str, after: int) -> AsyncGenerator[Frame, None]:
        return await stored_replay(self._sessions, tenant, session_id, after)

    async def running_turns(self) -> int:
        local = await self._local.running_turns() if self._local is not None else 0
        return local + self._streams

    async def close(self) -> None:
        await self._client.close()


class _Counted:
    """A relayed turn, counted while its reader holds it (graceful shutdown waits for relays too)."""

    def __init__(self, turn: Turn, owner: RoutingBackend) -> None:
        self._turn = turn
        self._owner = owner
        self._open = True
        owner._streams += 1

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._turn.__aiter__()

    def detach(self) -> None:
        if self._open:
            self._open = False
            self._owner._streams -= 1
        self._turn.detach()
