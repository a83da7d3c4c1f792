"""PoolActor: owns every sandbox of this server, their states, capacity, eviction and the idle sweep.

Slow work (starting pre-warmed sandboxes: disk image and launch; waiting for a bridge to come up;
the shutdown ladder; snapshots of evicted sandboxes) runs on the pool's own threads, which report
back with `tell`, so the actor's inbox stays responsive: a claim never waits behind a refill.
The pool never asks a session: losses are told to a listener (rule: ask only down).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil
import pykka

from ashd.actors._activity import Activity
from ashd.actors._board import StatsBoard
from ashd.actors._inline import TurnTakingActor
from ashd.actors._pool_types import Launching, LossReason, PoolState, SandboxHandle, SandboxLost
from ashd.actors._readiness import wait_bridge_ready
from ashd.errors import CapacityError, SandboxError, ServiceError, StorageFull
from ashd.sandboxing import ExitInfo, SandboxSpec
from ashd.storage import log_failure

log = logging.getLogger(__name__)

_FULL_DISK_RETRY = 60.0  # seconds before an idle sandbox kept for a full disk is looked at again
# Spares first (cold, then warm, then a spare still warming: each cheaper than a session), then sessions.
_EVICTION_ORDER = (PoolState.COLD, PoolState.WARM, PoolState.WARMING, PoolState.WAITING)


MAX_DEFAULT_CAPACITY = 1000


def default_capacity(memory_limit_bytes: int, host_memory_bytes: int | None = None) -> int:
    """`SERVICE_MAX_SANDBOXES` when unset: host memory / per-sandbox memory limit, 1 to 1000."""
    total = psutil.virtual_memory().total if host_memory_bytes is None else host_memory_bytes
    return max(1, min(MAX_DEFAULT_CAPACITY, total // max(1, memory_limit_bytes)))


@dataclass
class _Entry:
    sandbox_id: str
    state: PoolState
    created: float
    last_active: float
    network: bool
    seccomp: str
    proc: Any = None  # SandboxProcess once launched
    tenant: str | None = None
    session_id: str | None = None
    disk_bytes: int = 0  # size of its disk (SandboxLimits.disk_bytes)
    # False from a claim until the session has configured the sandbox (mark_ready): a sandbox
    # being configured (agent files, setup.sh) is neither idle nor evictable.
    configured: bool = False
    # A sandbox being started off the actor (a spare, or a claim's when no spare could serve it;
    # disk image, launch): its result is the proc.
    starting: Future[Any] | None = None
    # `running`: a turn (or an API command) runs in it, set and cleared by its session's thread
    # (`_hold`, `_unhold`: no ask at a turn's start); `taken`: this actor takes it away (capacity,
    # idle sweep). Each is set under `guard` after checking the other, so one of the two wins: a
    # sandbox is never taken from a running turn, and a turn never starts in one being taken.
    guard: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    running: bool = False
    taken: bool = False
    # Its session let it go (`SandboxHandle.letting_go`), set from the session's thread before the
    # release is told to this actor: an exit seen before that release is handled is the one asked for.
    released: bool = False

    @property
    def generic(self) -> bool:
        return self.session_id is None and self.state in (PoolState.WARMING, PoolState.WARM)


@dataclass(frozen=True)
class PoolConfig:
    max_capacity: int
    prewarm: int
    idle_timeout: float
    shutdown_grace: float  # seconds between a sandbox's SIGTERM and its SIGKILL
    ready_timeout: float = 60.0
    # None: a quarter of the idle timeout, between 50 ms and 5 s, so a short idle timeout (tests,
    # small hosts) is honoured closely and a dead sandbox is noticed within seconds.
    sweep_interval: float | None = None

    @property
    def effective_sweep_interval(self) -> float:
        if self.sweep_interval is not None:
            return self.sweep_interval
        return max(0.05, min(5.0, self.idle_timeout / 4))


class PoolActor(TurnTakingActor):
    def __init__(
        self,
        config: PoolConfig,
        launcher: Any,
        spec_for: Callable[[str, bool], SandboxSpec],
        snapshot: Callable[[str, Any], None] | None,
        on_lost: Callable[[SandboxLost], None],
        warmer: Any = None,
        activity: Activity | None = None,
    ) -> None:
        super().__init__()
        self._warmer = warmer  # loop-side preparation of warm sandboxes (connection, model proxy)
        self._activity = activity  # the front end's requests: a spare's start waits for a quiet moment
        self.config = config
        self.board = StatsBoard({})
        self._launcher = launcher
        self._spec_for = spec_for  # (sandbox_id, network) -> SandboxSpec
        self._snapshot = snapshot  # (session_id, workspace path) -> None; blocking
        self._on_lost = on_lost
        self._entries: dict[str, _Entry] = {}
        self._counters = {"preWarmHits": 0}  # resumes are counted on the board by the sessions (`count_resume`)
        self._states: dict[str, int] = {s.value: 0 for s in PoolState}  # the entries' states, as last published
        self._workers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pool-worker")
        # Separate from the workers: a destroy (on a worker) may wait for a start to finish.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool-starter")
        # Claims that found no spare launch here, several at once (a burst of creates).
        self._launches = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pool-launch")
        self._stopping = threading.Event()
        # Set when a claim found no spare (a burst, or the pool is stopping): a spare waiting for a
        # quiet moment starts at once, the next claim needs it.
        self._hurry = threading.Event()
        self._sweeper: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def on_start(self) -> None:
        self._refill()
        self._publish()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="pool-sweeper", daemon=True)
        self._sweeper.start()

    def on_stop(self) -> None:
        self._stopping.set()
        self._hurry_spare()
        entries = list(self._entries.values())
        self._entries.clear()
        self._publish()
        # In parallel: each shutdown ladder may wait its grace period. Queued destroys still run.
        for entry in entries:
            self._workers.submit(self._destroy_now, entry)
        self._workers.shutdown(wait=True)  # its destroys wait for the launches they take away
        self._starter.shutdown(wait=True)
        self._launches.shutdown(wait=True)

    # --- queries -----------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return dict(self.board.read())

    def is_alive(self, sandbox_id: str) -> bool:
        entry = self._entries.get(sandbox_id)
        return entry is not None and entry.proc is not None and entry.proc.poll() is None

    def _holds(self, entry: _Entry) -> bool:
        """`is_alive` for one claimed entry, called from its session's thread, not this actor's: it
        only reads (one dict lookup, atomic under the GIL, and the process's exit status, which
        both kinds of child answer thread-safely), so it needs no trip through the mailbox. Ids are
        never reused: an entry under this id is this one."""
        return entry.sandbox_id in self._entries and entry.proc is not None and entry.proc.poll() is None

    def exit_info(self, sandbox_id: str) -> ExitInfo | None:
        entry = self._entries.get(sandbox_id)
        return entry.proc.poll() if entry is not None and entry.proc is not None else None

    # --- claims and transitions ---------------------------------------------------------------
    def claim(self, tenant: str, session_id: str, network: bool = False, seccomp: str = "default",
              disk_bytes: int | None = None) -> SandboxHandle | Launching:
        """A sandbox for this session: a pre-warmed one when possible, else a fresh one (`Launching`).

        Pre-warmed sandboxes have no network, the default seccomp profile and a disk of the
        default size, so a session that needs network, another profile or another disk size always
        gets a fresh one (a mounted ext4 cannot shrink, and growing it online needs
        CAP_SYS_RESOURCE; a fresh disk costs about 5 ms). A generic sandbox still warming is taken
        over rather than launching another: the session's connect waits for its bridge, which is
        never slower than a new launch. `disk_bytes` None: any size.
        """
        if not getattr(self._launcher, "disk_quota", True):
            disk_bytes = None  # no quota on this host: every sandbox serves every size
        spare = self.claim_spare(tenant, session_id, network, seccomp, disk_bytes)
        if spare is not None:
            return spare
        self._hurry_spare()
        self._make_room()
        # Launched off this thread: a claim that is counted (capacity) and assigned at once, as a
        # warming sandbox of its session, which waits for `Launching.handle`.
        entry = self._new_entry(network, seccomp)
        self._assign(entry, tenant, session_id, PoolState.WARMING)
        launched: Future[SandboxHandle] = Future()
        entry.starting = self._launches.submit(self._launch_claimed, entry, disk_bytes, launched)
        self._publish()
        return Launching(entry.sandbox_id, launched)

    def claim_spare(self, tenant: str, session_id: str, network: bool = False, seccomp: str = "default",
                    disk_bytes: int | None = None) -> SandboxHandle | None:
        """`claim`'s spare, pre-warmed or still warming, or None when there is none for this session.
        Only this actor's memory and a tell to itself: a create on the loop calls it there while this
        actor is idle (`_inline.call_inline`), without the trip to its thread and back."""
        if not getattr(self._launcher, "disk_quota", True):
            disk_bytes = None
        if network or seccomp != "default":
            return None
        warm = self._oldest(PoolState.WARM, disk_bytes)
        if warm is not None:
            self._assign(warm, tenant, session_id, PoolState.WAITING)
            self._counters["preWarmHits"] += 1
            self._publish()
            self._refill_later()  # after the reply: the claim never waits for a launch
            return self._handle(warm, prewarmed=True)
        starting = self._oldest(PoolState.WARMING, disk_bytes)
        if starting is not None:
            self._assign(starting, tenant, session_id, PoolState.WARMING)
            self._publish()
            self._refill_later()
            return self._handle(starting, prewarmed=False)
        return None

    def _handle(self, entry: _Entry, prewarmed: bool) -> SandboxHandle:
        paths = self._launcher.paths_for(entry.sandbox_id)
        meter = getattr(entry.proc, "meter", None)
        return SandboxHandle(entry.sandbox_id, paths, prewarmed=prewarmed, meter=meter,
                             disk_bytes=entry.disk_bytes, alive=functools.partial(self._holds, entry),
                             hold=functools.partial(self._hold, entry), unhold=functools.partial(self._unhold, entry),
                             letting_go=functools.partial(self._letting_go, entry))

    @staticmethod
    def _letting_go(entry: _Entry) -> None:
        entry.released = True  # one write, read by this actor's thread (`_exited`)

    def _hold(self, entry: _Entry) -> bool:
        """`mark_running` from the session's thread, without a trip through this actor's mailbox
        (a turn's start waited for it): False when the sandbox is gone or being taken away, and then
        the session asks `mark_running`, which this actor answers after the take-away (its snapshot
        is stored before the session restores from it). This actor is told, to count it."""
        with entry.guard:
            if entry.taken or not self._holds(entry):
                return False
            entry.running = True
            entry.last_active = time.monotonic()
        self._tell("_held", entry.sandbox_id)
        return True

    def _unhold(self, entry: _Entry) -> None:
        """`mark_waiting` from the session's thread: the turn (or command) ended."""
        with entry.guard:
            entry.running = False
            entry.last_active = time.monotonic()
        self._tell("_held", entry.sandbox_id)

    def _tell(self, method: str, *args: Any) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing left to count
            self.actor_ref.tell(_Call(method, args))

    def _held(self, sandbox_id: str) -> None:
        """A session held or let go of its sandbox (`_hold`, `_unhold`): its state follows."""
        entry = self._entries.get(sandbox_id)
        if entry is None:
            return
        before = entry.state
        if entry.running:
            entry.state = PoolState.RUNNING  # as `mark_running` makes it, whatever it was
        elif entry.state is PoolState.RUNNING:
            entry.state = PoolState.WAITING
        if entry.state is not before:
            # Each turn's start and end: one entry moved, so the counts follow it, without counting
            # every entry again (115 us a time with 1,000 sessions held, docs/performance.md,
            # thirty-seventh pass). Every other change counts them all (`_publish`).
            self._states[before.value] -= 1
            self._states[entry.state.value] += 1
            self._publish_states()

    def _publish(self) -> None:
        states = {s.value: 0 for s in PoolState}
        for entry in self._entries.values():
            states[entry.state.value] += 1
        self._states = states
        self._publish_states()

    def _publish_states(self) -> None:
        self.board.publish({
            "total": len(self._entries), **self._states, "maxCapacity": self.config.max_capacity,
            "resumeWarmHits": 0, "resumeColdHits": 0, **self._counters,  # the board adds what it counted
        })

    def mark_ready(self, sandbox_id: str) -> None:
        """The session has connected to and configured its sandbox: warming → waiting.

        For a pre-warmed claim (already waiting) this ends the configuration window, from which
        on the sandbox can be idle-swept or evicted.
        """
        entry = self._entries.get(sandbox_id)
        if entry is None:
            return
        entry.last_active = time.monotonic()
        if entry.session_id is not None:
            entry.configured = True
        if entry.state is PoolState.WARMING:
            entry.state = PoolState.WAITING if entry.session_id else PoolState.WARM
        self._publish()

    def check_exited(self, sandbox_id: str) -> bool:
        """True when this sandbox is gone: no longer this pool's, or its process has exited. A session
        that found it dead before the sweep did has the exit handled now (its workspace saved as the
        session's newest snapshot) and answered after, so what it restores next is that snapshot."""
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.proc is None:
            return entry is None
        info = entry.proc.poll()
        if info is None:
            return False
        self._exited(sandbox_id, info)
        return True

    def mark_running(self, sandbox_id: str) -> bool:
        if self.check_exited(sandbox_id):
            return False
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.proc is None:
            return False
        with entry.guard:
            entry.running = True
        entry.state = PoolState.RUNNING
        entry.last_active = time.monotonic()
        self._publish()
        return True

    def mark_waiting(self, sandbox_id: str) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is not None and entry.state in (PoolState.RUNNING, PoolState.WARMING, PoolState.WAITING):
            with entry.guard:
                entry.running = False
            entry.state = PoolState.WAITING
            entry.last_active = time.monotonic()
            self._publish()

    def count_resume(self, path: str) -> None:
        count_resume(self.board, path)

    def release(self, sandbox_id: str, wait: bool = False, after: Future[Any] | None = None) -> None:
        """Destroy a session's sandbox (after the session asked its bridge to shut down, or, with
        `after`, once that request is done: the capacity is free at once, the process goes after)."""
        entry = self._entries.pop(sandbox_id, None)
        if entry is None:
            return
        self._publish()
        if wait:
            self._destroy_now(entry)
        elif after is not None:
            self._workers.submit(self._destroy_after, entry, after)
        else:
            self._workers.submit(self._destroy_now, entry)
        self._refill()
        self._publish()

    # --- internal messages (told by worker threads) -------------------------------------------
    def _became_ready(self, sandbox_id: str, ok: bool) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is None:
            return
        if not ok:
            log.warning("pre-warmed sandbox did not become ready; destroying it",
                        extra={"sandboxId": sandbox_id})
            self._entries.pop(sandbox_id, None)
            self._workers.submit(self._destroy_now, entry)
            if entry.session_id:
                self._on_lost(SandboxLost(entry.session_id, sandbox_id, LossReason.EXITED,
                                          "the sandbox's bridge did not start"))
            self._refill()
        elif entry.state is PoolState.WARMING and entry.session_id is None:
            entry.state = PoolState.WARM
        self._publish()

    def _exited(self, sandbox_id: str, info: ExitInfo) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.released:
            # Released by its session, which asked its bridge to exit: a sweep or a check queued
            # before the release saw that exit. The release, told already, stops what is left.
            return
        del self._entries[sandbox_id]
        log.warning("sandbox exited: %s", info.describe(), extra={"sandboxId": sandbox_id,
                                                                   "sessionId": entry.session_id})
        # Its workspace outlives its processes: stored as the session's newest snapshot, here and
        # before anything else is answered, as a take-away does (the session's next turn or resume
        # restores from it), so what the agent wrote since the last snapshot is not lost with it.
        try:
            self._snapshot_before(entry, LossReason.EXITED)
        except StorageFull as exc:
            log.error("the workspace of an exited sandbox could not be saved: %s", exc.message,
                      extra={"sandboxId": sandbox_id, "sessionId": entry.session_id})
        self._workers.submit(self._destroy_now, entry)
        if entry.session_id:
            self._on_lost(SandboxLost(entry.session_id, sandbox_id, LossReason.EXITED, info.describe()))
        self._refill()
        self._publish()

    def sweep(self) -> None:
        """Idle sweep: a waiting sandbox idle longer than the timeout is snapshotted and stopped."""
        now = time.monotonic()
        for entry in list(self._entries.values()):
            if entry.proc is not None and entry.state is not PoolState.COLD:
                info = entry.proc.poll()
                if info is not None:
                    self._exited(entry.sandbox_id, info)
                    continue
            # Only a configured, waiting sandbox can be idle: running means a turn (model calls,
            # tool calls) is in progress however long it takes, and mark_waiting restarts the clock.
            if (entry.state is PoolState.WAITING and entry.configured and not entry.running
                    and now - entry.last_active >= self.config.idle_timeout):
                try:
                    if not self._take_away(entry, LossReason.IDLE):
                        continue  # its session began a turn meanwhile
                except StorageFull:
                    # Keep it rather than lose the workspace; look again in a minute.
                    entry.last_active = now - self.config.idle_timeout + _FULL_DISK_RETRY
                    log.warning("idle session sandbox kept: its workspace cannot be snapshotted while the "
                                "data disk is full", extra={"sandboxId": entry.sandbox_id,
                                                            "sessionId": entry.session_id})
                    continue
                log.warning("idle session sandbox stopped",
                            extra={"sandboxId": entry.sandbox_id, "sessionId": entry.session_id,
                                   "idleSeconds": int(now - entry.last_active)})
        self._publish()

    # --- helpers -----------------------------------------------------------------------------
    def _oldest(self, state: PoolState, disk_bytes: int | None = None) -> _Entry | None:
        """The oldest entry in this state (a waiting one: the least recently active). Warming: only
        a spare (no session yet; every spare has no network and the default profile); waiting: only
        a configured session (see _Entry.configured)."""
        candidates = [e for e in self._entries.values() if e.state is state
                      and (disk_bytes is None or e.disk_bytes == disk_bytes)]
        if state is PoolState.WARMING:
            candidates = [e for e in candidates if e.session_id is None]
        if state is PoolState.WAITING:
            candidates = [e for e in candidates if e.configured and not e.running]
        return min(candidates, key=lambda e: e.last_active if state is PoolState.WAITING else e.created,
                   default=None)

    def _assign(self, entry: _Entry, tenant: str, session_id: str, state: PoolState) -> None:
        entry.tenant = tenant
        entry.session_id = session_id
        entry.state = state
        entry.configured = False
        entry.last_active = time.monotonic()

    def _make_room(self) -> None:
        if len(self._entries) < self.config.max_capacity:
            return
        for state in _EVICTION_ORDER:
            victim = self._oldest(state)
            if victim is None:
                continue
            if state is PoolState.WAITING:
                try:
                    if not self._take_away(victim, LossReason.EVICTED):
                        self._make_room()  # its session began a turn meanwhile: choose again
                        return
                except StorageFull as exc:  # the victim's own message names another tenant's session
                    raise StorageFull(
                        "Sandbox capacity is reached and the server's data disk is full: a waiting session "
                        "cannot be snapshotted to make room without losing its workspace. Retry once space "
                        "is freed") from exc
            else:
                self._entries.pop(victim.sandbox_id, None)
                self._workers.submit(self._destroy_now, victim)
            log.info("evicted a %s sandbox for capacity", state.value, extra={"sandboxId": victim.sandbox_id})
            return
        raise CapacityError(
            f"Sandbox capacity reached ({self.config.max_capacity} sandboxes, all busy with running turns "
            "or starting sessions); try again later, or raise SERVICE_MAX_SANDBOXES"
        )

    def _take_away(self, entry: _Entry, reason: LossReason) -> bool:
        """Snapshot a waiting session's workspace, destroy its sandbox and tell the session side;
        False when its session held it for a turn first (`_hold`): it is not taken.

        The snapshot is taken here, in the actor, on purpose: a session that notices the loss
        (`_hold` refused, mark_running answers False) restores from the snapshot, so the snapshot
        must be complete before this actor answers anything else. The slow part, the shutdown
        ladder, is a worker's. A full disk raises StorageFull and leaves the sandbox in place (and
        its session free to hold it again): its workspace would be lost.
        """
        with entry.guard:
            if entry.running:
                return False
            entry.taken = True
        try:
            self._snapshot_before(entry, reason)
        except StorageFull:
            with entry.guard:
                entry.taken = False
            raise
        self._entries.pop(entry.sandbox_id, None)
        self._workers.submit(self._destroy_now, entry)
        if entry.session_id:
            detail = ("evicted to make room for another session" if reason is LossReason.EVICTED
                      else "idle timeout")
            self._on_lost(SandboxLost(entry.session_id, entry.sandbox_id, reason, detail))
        return True

    def _snapshot_before(self, entry: _Entry, reason: LossReason) -> None:
        if entry.session_id and self._snapshot is not None:
            try:
                self._snapshot(entry.session_id, self._launcher.paths_for(entry.sandbox_id).workspace)
            except StorageFull:
                raise
            except ServiceError as exc:  # e.g. a workspace over the snapshot limit: the previous stays
                log.warning("snapshot before %s not taken: %s", reason.value, exc.message,
                            extra={"sandboxId": entry.sandbox_id, "sessionId": entry.session_id})
            except Exception:
                log.exception("snapshot before %s failed", reason.value,
                              extra={"sandboxId": entry.sandbox_id})

    def _new_entry(self, network: bool, seccomp: str = "default") -> _Entry:
        sandbox_id = "sb-" + uuid.uuid4().hex[:16]
        now = time.monotonic()
        entry = _Entry(sandbox_id, PoolState.COLD, now, now, network=network, seccomp=seccomp)
        self._entries[sandbox_id] = entry
        return entry

    def _prepare_and_launch(self, entry: _Entry, disk_bytes: int | None) -> Any:
        """Blocking: the sandbox's disk (mkfs + mount, about 5 ms) and its launch. Any thread."""
        self._launcher.prepare(entry.sandbox_id, disk_bytes)  # None: the configured size
        spec = self._spec_for(entry.sandbox_id, entry.network)
        if entry.seccomp != spec.seccomp:
            spec = dataclasses.replace(spec, seccomp=entry.seccomp)
        if disk_bytes is not None:
            spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, disk_bytes=disk_bytes))
        entry.disk_bytes = spec.limits.disk_bytes
        return self._launcher.launch(spec)

    def _launch_claimed(self, entry: _Entry, disk_bytes: int | None, launched: Future[SandboxHandle]) -> Any:
        """Launch thread: a claimed sandbox's disk image and process, handed back (`_claim_launched`)."""
        proc, error = None, None
        try:
            proc = self._prepare_and_launch(entry, disk_bytes)
        except Exception as exc:  # noqa: BLE001 - the claimer's answer, told through the actor
            error = exc
        try:
            self.actor_ref.tell(_Call("_claim_launched", (entry, proc, error, launched)))
        except pykka.ActorDeadError:  # stopping: the entry's destroy waits for this start and cleans up
            launched.set_exception(SandboxError("The server is stopping; the sandbox was not started"))
        return proc

    def _claim_launched(self, entry: _Entry, proc: Any, error: Exception | None,
                        launched: Future[SandboxHandle]) -> None:
        sandbox_id = entry.sandbox_id
        if self._entries.get(sandbox_id) is not entry:
            # Released meanwhile (the claimer gave up): its destroy waits for this start.
            launched.set_exception(SandboxError("The sandbox was released while it started"))
            return
        entry.starting = None
        if error is None:
            entry.proc = proc
            launched.set_result(self._handle(entry, prewarmed=False))
            return
        self._entries.pop(sandbox_id, None)
        self._workers.submit(self._destroy_now, entry)
        self._publish()
        if isinstance(error, CapacityError):  # no room on the data disk for its image: say so
            log.warning("sandbox launch refused: %s", error.message, extra={"sandboxId": sandbox_id})
            launched.set_exception(error)
            return
        log_failure(log, "sandbox launch failed", error, sandboxId=sandbox_id)
        # The exception's text may name host paths; clients get its kind, the log the rest.
        failure = SandboxError(f"Sandbox could not be started ({type(error).__name__}); the details are in "
                               "the server log")
        failure.__cause__ = error
        launched.set_exception(failure)

    def _refill_later(self) -> None:
        if not self._stopping.is_set():
            self.actor_ref.tell(_Call("_refill_now", ()))

    def _refill_now(self) -> None:
        self._refill()
        self._publish()

    def _refill(self) -> None:
        if self._stopping.is_set():
            return
        spare = sum(1 for e in self._entries.values()
                    if e.generic or (e.state is PoolState.COLD and e.session_id is None))
        while spare < self.config.prewarm and len(self._entries) < self.config.max_capacity:
            entry = self._new_entry(network=False)
            entry.starting = self._starter.submit(self._start_spare, entry)
            spare += 1

    def _hurry_spare(self) -> None:
        """A spare waiting for a quiet moment starts now (a claim found none; the pool stops)."""
        self._hurry.set()
        if self._activity is not None:
            self._activity.wake()

    def _start_spare(self, entry: _Entry) -> Any:
        """Starter thread: a pre-warmed sandbox made off the actor, then handed back (`_started`)."""
        if self._stopping.is_set():
            return None
        if self._activity is not None:
            # A spare is for the next claim, not this request: its start's CPU would be taken from the
            # requests running now (the claim's own session first of all). See `_activity.py`.
            self._activity.wait_quiet(stop=self._hurry)
            if self._stopping.is_set():
                return None
            self._hurry.clear()
        try:
            proc = self._prepare_and_launch(entry, None)
        except Exception as exc:  # noqa: BLE001 - told to the actor, which drops the entry
            log.warning("pre-warmed sandbox could not be started: %s", exc, extra={"sandboxId": entry.sandbox_id})
            proc = None
        # Stopping: the tell fails, and the entry's destroy waits for this start and cleans up.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(_Call("_started", (entry.sandbox_id, proc)))
        return proc

    def _started(self, sandbox_id: str, proc: Any) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.state is not PoolState.COLD:
            return  # evicted meanwhile: its destroy (queued then) takes care of the proc
        entry.starting = None
        if proc is None:
            self._entries.pop(sandbox_id, None)
            self._workers.submit(self._destroy_now, entry)
            self._publish()
            return  # no refill here: a failing launch would loop; the next claim or release retries
        entry.proc = proc
        entry.state = PoolState.WARMING
        if self._warmer is not None:
            # Its warm connection is the probe: the bridge's socket listens from the launch on
            # (socket activation), so only the bridge's answer says it is up. Asked here, before
            # any claim of this entry is answered, so a claimer always finds the connection.
            self._warmer.prepare(sandbox_id, self._launcher.paths_for(sandbox_id), self._on_warm)
        else:
            self._workers.submit(self._await_ready, sandbox_id, proc)
        self._publish()

    def _on_warm(self, sandbox_id: str, ok: bool) -> None:
        """The warmer's answer (on the loop): told to this actor."""
        if not self._stopping.is_set():
            self._tell("_became_ready", sandbox_id, ok)

    def _await_ready(self, sandbox_id: str, proc: Any) -> None:
        paths = self._launcher.paths_for(sandbox_id)
        ok = wait_bridge_ready(paths.bridge_socket, self.config.ready_timeout,
                               alive=lambda: proc.poll() is None and not self._stopping.is_set())
        if not self._stopping.is_set():
            self.actor_ref.tell(_Call("_became_ready", (sandbox_id, ok)))

    def _destroy_after(self, entry: _Entry, after: Future[Any]) -> None:
        with contextlib.suppress(Exception):  # its failure was logged where it ran; the sandbox goes anyway
            after.result(timeout=self.config.shutdown_grace + 2)
        self._destroy_now(entry)

    def _destroy_now(self, entry: _Entry) -> None:
        starting = entry.starting
        if starting is not None:  # taken away while being started: wait for the start to finish
            try:
                proc = starting.result()
            except Exception:  # noqa: BLE001 - it failed: nothing was launched
                proc = None
            if entry.proc is None:
                entry.proc = proc
        if entry.session_id is None and self._warmer is not None:
            # Never claimed: nobody else closes its warm connection (none yet: nothing to close).
            self._warmer.discard(entry.sandbox_id)
        try:
            if entry.proc is not None:
                rung = entry.proc.shutdown(None, grace=self.config.shutdown_grace)
                entry.proc.cleanup()
                log.debug("sandbox destroyed", extra={"sandboxId": entry.sandbox_id, "rung": rung.value})
            self._launcher.destroy_dirs(entry.sandbox_id)
        except Exception:
            log.exception("sandbox destroy failed", extra={"sandboxId": entry.sandbox_id})

    def _sweep_loop(self) -> None:
        while not self._stopping.wait(self.config.effective_sweep_interval):
            try:
                self.actor_ref.tell(_Call("sweep", ()))
            except pykka.ActorDeadError:  # the actor is stopping
                return

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Call):
            return getattr(self, message.method)(*message.args)
        return super().on_receive(message)


def count_resume(board: StatsBoard, path: str) -> None:
    """A session's resume, counted in the pool's stats from the session's own thread (no ask)."""
    board.count("resumeWarmHits" if path == "warm" else "resumeColdHits")


@dataclass(frozen=True)
class _Call:
    method: str
    args: tuple[Any, ...]
