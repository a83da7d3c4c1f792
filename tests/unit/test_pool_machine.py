"""The pool's state machine on its own: PoolActor messages over plain host processes (no HTTP,
no isolation; tests/fixtures/plain_launcher.py). States, eviction order, the configuration window,
the idle sweep and tenant separation, as the sessions and the operator see them: pool counts,
losses told to the session side, and which sandbox each claim gets."""

from __future__ import annotations

import asyncio
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ashd import runtime as runtime_module
from ashd.actors import Activity
from ashd.actors import _pool as pool_module
from ashd.actors._pool import PoolActor, PoolConfig, default_capacity
from ashd.actors._pool_types import Launching, LossReason, SandboxHandle, SandboxLost
from ashd.actors._warmer import Warmer
from ashd.errors import CapacityError, PayloadTooLarge, SandboxError, StorageError, StorageFull
from ashd.sandboxing._types import SandboxSpec
from tests.fixtures.plain_launcher import PlainLauncher
from tests.fixtures.sandboxes import wait_for

STATES = ("cold", "warming", "warm", "waiting", "running")
ASK = 30.0


def claimed(answer: SandboxHandle | Launching) -> SandboxHandle:
    """A claim's sandbox: a spare's at once, a launched one once its launch ends (or its error)."""
    return answer.handle.result(timeout=ASK) if isinstance(answer, Launching) else answer


class Pool:
    """A started PoolActor and what it told the outside (losses, snapshots), in order."""

    def __init__(self, launcher: PlainLauncher, config: PoolConfig, warmer: Warmer | None = None,
                 activity: Activity | None = None) -> None:
        self.launcher = launcher
        self.full_disk = False  # snapshots fail with StorageFull while set
        self.snapshot_error: Exception | None = None  # any other snapshot failure, while set
        self.refused: list[str] = []  # sessions whose snapshot the full disk refused
        self.lost: queue.Queue[SandboxLost] = queue.Queue()
        self.log: list[tuple[str, str]] = []
        self.ref = PoolActor.start(config, launcher, self._spec, self._snapshot, self._on_lost, warmer, activity)
        self.actor = self.ref.proxy()

    def _spec(self, sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id, self.launcher.paths_for(sandbox_id), network=network)

    def _snapshot(self, session_id: str, workspace: Path) -> None:
        assert workspace.is_dir()
        if self.full_disk:
            self.refused.append(session_id)
            raise StorageFull(f"the snapshot of session {session_id} does not fit on the data disk")
        if self.snapshot_error is not None:
            raise self.snapshot_error
        self.log.append(("snapshot", session_id))

    def _on_lost(self, lost: SandboxLost) -> None:
        self.log.append(("lost", lost.session_id))
        self.lost.put(lost)

    def counts(self) -> dict[str, int]:
        stats: dict[str, int] = self.actor.stats().get(timeout=ASK)
        assert stats["total"] == sum(stats[s] for s in STATES), stats
        return {s: stats[s] for s in STATES if stats[s]}

    def wait_counts(self, expected: dict[str, int]) -> None:
        wait_for(lambda: self.counts() == expected, 30, f"pool counts {expected}")

    def claim(self, tenant: str, session: str, network: bool = False) -> SandboxHandle:
        return claimed(self.actor.claim(tenant, session, network).get(timeout=ASK))

    def ready(self, handle: SandboxHandle) -> None:
        """What a session does once it has configured its sandbox."""
        self.actor.mark_ready(handle.sandbox_id).get(timeout=ASK)

    def turn(self, handle: SandboxHandle) -> None:
        """One turn: running, then waiting again (the sandbox's last activity is now)."""
        assert self.actor.mark_running(handle.sandbox_id).get(timeout=ASK) is True
        self.actor.mark_waiting(handle.sandbox_id).get(timeout=ASK)

    def alive(self, handle: SandboxHandle) -> bool:
        return self.alive_id(handle.sandbox_id)

    def alive_id(self, sandbox_id: str) -> bool:
        return bool(self.actor.is_alive(sandbox_id).get(timeout=ASK))

    def next_loss(self) -> SandboxLost:
        return self.lost.get(timeout=30)


@pytest.fixture
def make_pool(short_tmp: Path) -> Iterator[Callable[..., Pool]]:
    launcher = PlainLauncher(short_tmp)
    made: list[Pool] = []

    def make(disk_quota: bool = False, launch_failure: Exception | None = None, bridge: bool = False,
             warmer: Warmer | None = None, activity: Activity | None = None, hold_launches: bool = False,
             hold_bridges: bool = False, **config: Any) -> Pool:
        # Before the pool starts: its first spares are launched at once.
        if hold_launches:
            launcher.launch_gate.clear()
        if hold_bridges:
            launcher.hold()
        launcher.disk_quota = disk_quota
        launcher.failure = launch_failure
        launcher.bridge = bridge
        values: dict[str, Any] = {"max_capacity": 4, "prewarm": 0, "idle_timeout": 3600.0, "shutdown_grace": 1.0}
        values.update(config)
        pool = Pool(launcher, PoolConfig(**values), warmer, activity)
        made.append(pool)
        return pool

    yield make
    launcher.launch_gate.set()  # a pool stops only once the launches it started have returned
    launcher.destroy_gate.set()
    for pool in made:
        if pool.ref.is_alive():
            pool.ref.stop(block=True, timeout=60)
    launcher.kill_all()


def test_states_from_prewarm_to_release(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1)
    pool.wait_counts({"warm": 1})  # cold → warming → warm
    handle = pool.claim("t", "s1")
    assert handle.prewarmed
    pool.wait_counts({"waiting": 1, "warm": 1})  # claimed; a new spare replaces it
    stats = pool.actor.stats().get(timeout=ASK)
    assert (stats["preWarmHits"], stats["maxCapacity"], stats["total"]) == (1, 4, 2)
    pool.ready(handle)
    assert pool.actor.mark_running(handle.sandbox_id).get(timeout=ASK) is True
    assert pool.counts() == {"running": 1, "warm": 1}
    pool.actor.mark_waiting(handle.sandbox_id).get(timeout=ASK)
    assert pool.counts() == {"waiting": 1, "warm": 1}
    pool.actor.release(handle.sandbox_id, True).get(timeout=ASK)
    assert pool.counts() == {"warm": 1}
    assert handle.sandbox_id in pool.launcher.destroyed  # never back to the warm set
    assert pool.actor.mark_running(handle.sandbox_id).get(timeout=ASK) is False
    assert pool.alive(handle) is False


def test_fresh_claim_is_warming_until_the_session_is_ready(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool()
    handle = pool.claim("t", "s1", network=True)
    assert not handle.prewarmed
    assert pool.counts() == {"warming": 1}
    pool.ready(handle)
    assert pool.counts() == {"waiting": 1}
    assert pool.actor.stats().get(timeout=ASK)["preWarmHits"] == 0


def test_eviction_takes_the_least_recently_active_session(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=2)
    older = pool.claim("t", "older")
    pool.ready(older)
    newer = pool.claim("t", "newer")
    pool.ready(newer)
    pool.turn(older)  # created first, but active last
    pool.claim("t", "third")
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason) == ("newer", LossReason.EVICTED)
    assert lost.detail == "evicted to make room for another session"  # the session's lifecycle event says so
    assert pool.log == [("snapshot", "newer"), ("lost", "newer")]  # snapshot first: nothing lost
    assert pool.alive(older)
    assert not pool.alive(newer)


def test_eviction_order_spare_before_session_and_never_a_running_turn(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=2, prewarm=1)
    pool.wait_counts({"warm": 1})
    session = pool.claim("t", "s1", network=True)  # a network sandbox is never pre-warmed
    pool.ready(session)
    pool.wait_counts({"waiting": 1, "warm": 1})
    second = pool.claim("t", "s2", network=True)  # room is made by destroying the spare
    assert pool.lost.empty() and pool.alive(session)
    assert pool.counts() == {"waiting": 1, "warming": 1}
    pool.ready(second)
    assert pool.actor.mark_running(session.sandbox_id).get(timeout=ASK)
    assert pool.actor.mark_running(second.sandbox_id).get(timeout=ASK)
    with pytest.raises(CapacityError) as refused:  # running turns are never evicted: 503
        pool.claim("t", "s3", network=True)
    assert refused.value.status_code == 503
    assert pool.counts() == {"running": 2}
    assert pool.lost.empty()


def test_a_spare_still_warming_is_evicted_before_refusing(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=1, prewarm=1, hold_bridges=True)  # the spare's bridge never comes up while held
    pool.wait_counts({"warming": 1})
    handle = pool.claim("t", "s1", network=True)  # capacity 1: only the spare can make room
    pool.launcher.release_all()
    assert pool.counts() == {"warming": 1}
    wait_for(lambda: pool.launcher.destroyed != [], 30, "the spare destroyed")
    assert handle.sandbox_id not in pool.launcher.destroyed
    pool.ready(handle)
    assert pool.counts() == {"waiting": 1}


def test_a_sandbox_being_configured_is_not_evicted(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=1, prewarm=1)
    pool.wait_counts({"warm": 1})
    configuring = pool.claim("t", "s1")  # pre-warmed: waiting at once, but not yet configured
    assert pool.counts() == {"waiting": 1}
    with pytest.raises(CapacityError) as refused:
        pool.claim("t", "s2", network=True)
    assert refused.value.status_code == 503
    assert pool.lost.empty() and pool.alive(configuring)
    pool.ready(configuring)  # configured: from now on it can make room
    pool.claim("t", "s3", network=True)
    assert pool.next_loss().session_id == "s1"


def test_the_idle_sweep_spares_a_sandbox_being_configured(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=3, prewarm=1, idle_timeout=0.2, sweep_interval=0.02)
    pool.wait_counts({"warm": 1})
    configuring = pool.claim("t", "configuring")  # claimed first: idle longest, but not configured
    pool.wait_counts({"waiting": 1, "warm": 1})
    idle = pool.claim("t", "idle")
    pool.ready(idle)
    lost = pool.next_loss()  # the configured one goes after its idle timeout
    assert (lost.session_id, lost.reason) == ("idle", LossReason.IDLE)
    assert pool.log == [("snapshot", "idle"), ("lost", "idle")]
    assert pool.alive(configuring)
    pool.ready(configuring)  # configured now: its idle clock starts
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason) == ("configuring", LossReason.IDLE)


def test_the_idle_sweep_spares_a_running_turn(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(idle_timeout=0.2, sweep_interval=0.02)
    busy = pool.claim("t", "busy")
    pool.ready(busy)
    assert pool.actor.mark_running(busy.sandbox_id).get(timeout=ASK)
    idle = pool.claim("t", "idle")
    pool.ready(idle)
    assert pool.next_loss().session_id == "idle"
    assert pool.counts() == {"running": 1}
    pool.actor.mark_waiting(busy.sandbox_id).get(timeout=ASK)  # the turn ends: the clock restarts
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason, lost.detail) == ("busy", LossReason.IDLE, "idle timeout")
    pool.wait_counts({})


def test_a_sandbox_held_from_its_sessions_thread_is_neither_evicted_nor_swept(make_pool: Callable[..., Pool]) -> None:
    """A turn's start marks its sandbox running without asking the pool (`handle.hold`): from then
    on it is no victim of the capacity or the idle sweep, and its count says running once the pool
    has been told; `unhold` makes it waiting (and takeable) again."""
    pool = make_pool(max_capacity=2, idle_timeout=0.3, sweep_interval=0.02)
    busy = pool.claim("t", "busy")
    pool.ready(busy)
    assert busy.hold is not None and busy.unhold is not None
    assert busy.hold() is True
    pool.wait_counts({"running": 1})
    other = pool.claim("t", "other")
    pool.ready(other)
    time.sleep(0.6)  # both idle past the timeout: only the one not held is swept
    assert pool.next_loss().session_id == "other"
    assert pool.alive(busy) and pool.lost.empty()
    third = pool.claim("t", "third")  # capacity 2, one free: no eviction needed
    pool.ready(third)
    fourth = pool.claim("t", "fourth")  # full: the waiting one goes, not the held one
    assert pool.next_loss().session_id == "third"
    assert pool.alive(busy)
    pool.ready(fourth)
    busy.unhold()
    assert {pool.next_loss().session_id, pool.next_loss().session_id} == {"busy", "fourth"}  # both idle now


def test_holds_and_unholds_keep_the_counts_of_every_state(make_pool: Callable[..., Pool]) -> None:
    """A turn's start and end move one count each (without counting every sandbox again); what
    changes in between, a claim or a release, counts them all: the counts always add up."""
    pool = make_pool(max_capacity=5, prewarm=1)
    pool.wait_counts({"warm": 1})
    handles = [pool.claim("t", f"s{i}") for i in range(3)]
    for handle in handles:
        pool.ready(handle)
    first, second, third = handles
    assert first.hold is not None and second.hold is not None
    assert first.unhold is not None and second.unhold is not None
    first.hold()
    second.hold()
    pool.wait_counts({"running": 2, "waiting": 1, "warm": 1})
    first.unhold()
    pool.wait_counts({"running": 1, "waiting": 2, "warm": 1})
    pool.actor.release(third.sandbox_id).get(timeout=ASK)
    pool.wait_counts({"running": 1, "waiting": 1, "warm": 1})
    first.hold()
    pool.wait_counts({"running": 2, "warm": 1})
    first.unhold()
    second.unhold()
    pool.wait_counts({"waiting": 2, "warm": 1})


def test_a_sandbox_taken_away_cannot_be_held_and_the_pool_says_so_after_its_snapshot(
        make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=1)
    first = pool.claim("t", "s1", network=True)
    pool.ready(first)
    second = pool.claim("t", "s2", network=True)  # capacity 1: s1 is snapshotted and taken away
    assert pool.next_loss().session_id == "s1"
    assert first.hold is not None and first.hold() is False  # gone: the session starts it again
    assert pool.actor.mark_running(first.sandbox_id).get(timeout=ASK) is False
    assert ("snapshot", "s1") in pool.log  # stored before the pool answered: the restore reads it
    assert second.hold is not None and second.hold() is True


def test_a_take_away_and_a_hold_racing_have_one_winner(make_pool: Callable[..., Pool]) -> None:
    """Threads racing a session's hold against the idle sweep: the sandbox is either held (and
    kept) or taken away (and the hold refused), never both."""
    pool = make_pool(max_capacity=8, idle_timeout=0.05, sweep_interval=0.005)
    for i in range(6):
        handle = pool.claim("t", f"s{i}")
        pool.ready(handle)
        assert handle.hold is not None
        time.sleep(0.045 + 0.002 * i)  # around the moment the sweep finds it idle
        held = handle.hold()
        if held:
            time.sleep(0.1)  # held: the sweep leaves it
            assert pool.alive(handle) and pool.lost.empty()
            assert handle.unhold is not None
            handle.unhold()
        assert pool.next_loss().session_id == f"s{i}"  # taken now, or after the hold was let go
        assert handle.hold() is False


def test_tenants_never_share_a_sandbox(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=8, prewarm=1)
    pool.wait_counts({"warm": 1})
    a_live = pool.claim("tenant-a", "a-live")
    pool.ready(a_live)  # tenant A's session stays, waiting between turns
    a_gone = pool.claim("tenant-a", "a-gone", network=True)
    pool.ready(a_gone)
    pool.actor.release(a_gone.sandbox_id).get(timeout=ASK)  # and one of A's sessions has ended
    pool.wait_counts({"waiting": 1, "warm": 1})
    used_by_a = {a_live.sandbox_id, a_gone.sandbox_id}
    for n in range(3):
        handle = pool.claim("tenant-b", f"b{n}", network=n == 2)
        assert handle.sandbox_id not in used_by_a
        pool.ready(handle)
    assert pool.alive(a_live) and pool.lost.empty()


def test_a_dead_sandbox_is_noticed_and_told(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(sweep_interval=0.02)
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.launcher.procs[handle.sandbox_id].popen.kill()
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason) == ("s1", LossReason.EXITED)
    assert "signal 9" in lost.detail
    pool.wait_counts({})
    assert pool.actor.mark_running(handle.sandbox_id).get(timeout=ASK) is False


def test_a_sandbox_its_session_lets_go_exits_as_asked_before_the_release_arrives(
        make_pool: Callable[..., Pool], caplog: pytest.LogCaptureFixture) -> None:
    """A session marks the sandbox let go, then tells the pool to release it and asks its bridge to
    exit. On a busy pool a sweep (or a check) queued before that release may see the exit first: it
    is the exit the session asked for, not a crash (no warning, no snapshot, no loss told)."""
    pool = make_pool(sweep_interval=0.02)
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    assert handle.letting_go is not None
    handle.letting_go()  # what the session does first; its release is held back here
    pool.launcher.procs[handle.sandbox_id].popen.kill()
    time.sleep(0.3)  # many sweeps
    assert pool.actor.check_exited(handle.sandbox_id).get(timeout=ASK) is True  # gone for its session
    pool.actor.release(handle.sandbox_id).get(timeout=ASK)
    pool.wait_counts({})
    assert pool.lost.empty() and pool.log == []
    assert not [r for r in caplog.records if "sandbox exited" in r.getMessage()]


def test_default_capacity_and_sweep_interval() -> None:
    gib = 1024**3
    assert default_capacity(512 * 1024**2, 24 * gib) == 48
    assert default_capacity(1024**2, 4096 * gib) == 1000  # capped
    assert default_capacity(64 * gib, 24 * gib) == 1  # never zero
    assert 1 <= default_capacity(512 * 1024**2) <= 1000  # this host's memory
    # A quarter of the idle timeout, between 50 ms and 5 s, unless set.
    assert [PoolConfig(1, 0, t, 1.0).effective_sweep_interval for t in (1.0, 100.0, 0.1)] == [0.25, 5.0, 0.05]
    assert PoolConfig(1, 0, 100.0, 1.0, sweep_interval=0.5).effective_sweep_interval == 0.5


def test_a_sandbox_idle_less_than_the_timeout_is_kept(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(sweep_interval=3600.0)  # sweeps only when told
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.actor.sweep().get(timeout=ASK)
    assert pool.lost.empty() and pool.alive(handle)
    assert pool.counts() == {"waiting": 1}


def test_a_claimed_sandbox_stays_its_sessions_when_its_bridge_comes_up(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=3, prewarm=1, hold_bridges=True)
    pool.wait_counts({"warming": 1})
    (spare,) = pool.launcher.procs
    taken = pool.claim("tenant-a", "a1")  # takes over the spare still warming rather than launch another
    assert not taken.prewarmed and taken.sandbox_id == spare
    pool.launcher.release_all()  # its bridge comes up: it is A's, not a warm spare for anyone
    pool.wait_counts({"warming": 1, "warm": 1})  # A's, still being configured; a new spare
    other = pool.claim("tenant-b", "b1")
    assert other.sandbox_id != taken.sandbox_id and other.prewarmed


def test_a_size_is_no_reason_to_skip_the_warm_set_without_disk_quotas(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1)
    pool.wait_counts({"warm": 1})
    handle: SandboxHandle = claimed(pool.actor.claim("t", "s1", False, "default", 123 * 1024 * 1024).get(timeout=ASK))
    assert handle.prewarmed  # this launcher has no disk quotas: every sandbox serves every size


def test_counters_and_exit_info(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(sweep_interval=3600.0)
    stats = pool.actor.stats().get(timeout=ASK)
    assert (stats["resumeWarmHits"], stats["resumeColdHits"], stats["preWarmHits"]) == (0, 0, 0)
    pool.actor.count_resume("warm").get(timeout=ASK)
    pool.actor.count_resume("cold").get(timeout=ASK)
    pool.actor.count_resume("cold").get(timeout=ASK)
    stats = pool.actor.stats().get(timeout=ASK)
    assert (stats["resumeWarmHits"], stats["resumeColdHits"]) == (1, 2)
    handle = pool.claim("t", "s1")
    assert pool.actor.exit_info(handle.sandbox_id).get(timeout=ASK) is None
    assert pool.actor.exit_info("sb-not-in-this-pool").get(timeout=ASK) is None
    proc = pool.launcher.procs[handle.sandbox_id]
    proc.popen.kill()
    proc.popen.wait()
    info = pool.actor.exit_info(handle.sandbox_id).get(timeout=ASK)
    assert info is not None and info.returncode == -9


def test_stopping_the_pool_destroys_every_sandbox(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=2)
    pool.wait_counts({"warm": 2})
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.wait_counts({"waiting": 1, "warm": 2})
    pool.ref.stop(block=True, timeout=60)
    assert all(proc.poll() is not None for proc in pool.launcher.procs.values())
    assert sorted(pool.launcher.destroyed) == sorted(pool.launcher.procs)


def test_a_sandbox_claimed_while_warming_is_never_taken_over_by_another_tenant(
        make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=4, prewarm=1, hold_bridges=True)  # no bridge comes up: everything stays warming
    pool.wait_counts({"warming": 1})
    taken = pool.claim("tenant-a", "a1")  # takes over the generic spare
    pool.wait_counts({"warming": 2})  # A's, and a new spare
    other = pool.claim("tenant-b", "b1")  # takes over the new spare, never A's
    assert other.sandbox_id != taken.sandbox_id
    pool.launcher.release_all()


def test_what_a_claim_asks_for_is_what_the_sandbox_is_launched_with(make_pool: Callable[..., Pool]) -> None:
    mib = 1024 * 1024
    pool = make_pool(disk_quota=True, prewarm=1, max_capacity=7)
    pool.wait_counts({"warm": 1})
    default_size = pool.launcher.specs[next(iter(pool.launcher.specs))].limits.disk_bytes
    plain: SandboxHandle = claimed(pool.actor.claim("t", "plain").get(timeout=ASK))  # defaults: no network
    assert plain.prewarmed and not pool.launcher.specs[plain.sandbox_id].network
    traced: SandboxHandle = claimed(pool.actor.claim("t", "traced", False, "ptrace").get(timeout=ASK))
    assert not traced.prewarmed and pool.launcher.specs[traced.sandbox_id].seccomp == "ptrace"
    # Whatever its name: a profile that sorts before "default" (a future one) is no default either.
    other: SandboxHandle = claimed(pool.actor.claim("t", "other", False, "browser").get(timeout=ASK))
    assert not other.prewarmed and pool.launcher.specs[other.sandbox_id].seccomp == "browser"
    big: SandboxHandle = claimed(pool.actor.claim("t", "big", False, "default", 300 * mib).get(timeout=ASK))
    assert not big.prewarmed and big.disk_bytes == 300 * mib
    assert pool.launcher.specs[big.sandbox_id].limits.disk_bytes == 300 * mib
    pool.wait_counts({"warm": 1, "waiting": 1, "warming": 3})
    size = int(str(default_size))  # equal, not the same object
    same: SandboxHandle = claimed(pool.actor.claim("t", "same", False, "default", size).get(timeout=ASK))
    assert same.prewarmed  # the warm spare has the default size


def test_a_full_disk_keeps_a_session_sandbox_rather_than_lose_its_workspace(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=1, idle_timeout=0.0, sweep_interval=3600.0)  # sweeps when told
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.full_disk = True
    pool.actor.sweep().get(timeout=ASK)
    assert pool.alive(handle) and pool.lost.empty()  # idle, but its snapshot could not be taken
    with pytest.raises(StorageFull) as refused:  # nor is it evicted for another session
        pool.claim("t", "s2", network=True)
    # 507, and in words the claiming tenant can act on, without naming the other session.
    assert refused.value.status_code == 507 and "capacity" in refused.value.message
    assert "s1" not in refused.value.message
    assert pool.alive(handle) and pool.lost.empty()
    pool.full_disk = False
    pool.claim("t", "s3", network=True)  # space is back: it is snapshotted, then evicted
    assert pool.next_loss().session_id == "s1"
    assert pool.log == [("snapshot", "s1"), ("lost", "s1")]


def test_a_full_disk_is_not_retried_at_every_sweep(make_pool: Callable[..., Pool]) -> None:
    """A refused snapshot is tried again a minute later, not every few seconds: each try copies the
    whole workspace onto a disk that is full."""
    pool = make_pool(idle_timeout=0.1, sweep_interval=3600.0)  # sweeps when told
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.full_disk = True

    def swept() -> bool:
        pool.actor.sweep().get(timeout=ASK)
        return pool.refused != []

    wait_for(swept, 30, "a sweep trying the idle sandbox's snapshot")
    pool.full_disk = False
    pool.actor.sweep().get(timeout=ASK)
    assert pool.refused == ["s1"] and pool.log == []
    assert pool.alive(handle) and pool.lost.empty()


@pytest.mark.parametrize("error", [
    PayloadTooLarge("the workspace holds more than SERVICE_SNAPSHOT_MAX_MB"),
    StorageError("cannot store snapshot"),
    OSError(5, "Input/output error"),
], ids=["over-the-limit", "store-error", "os-error"])
def test_a_snapshot_failing_otherwise_than_for_a_full_disk_does_not_block_eviction(
        make_pool: Callable[..., Pool], error: Exception) -> None:
    """Only a full disk keeps a sandbox (its workspace would be lost for good); a snapshot that
    fails for any other reason leaves the previous snapshot, and capacity is still made."""
    pool = make_pool(max_capacity=1)
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.snapshot_error = error
    pool.claim("t", "s2", network=True)
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason) == ("s1", LossReason.EVICTED)
    assert not pool.alive(handle)
    assert pool.counts() == {"warming": 1}


def test_the_idle_sweep_goes_ahead_when_a_snapshot_fails_otherwise(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(idle_timeout=0.0, sweep_interval=3600.0)
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.snapshot_error = OSError(5, "Input/output error")
    pool.actor.sweep().get(timeout=ASK)
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason, lost.detail) == ("s1", LossReason.IDLE, "idle timeout")
    assert pool.counts() == {}


def test_a_session_is_told_when_the_sandbox_it_took_over_never_comes_up(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, sweep_interval=3600.0, hold_bridges=True)  # no sweep: the readiness probe notices
    pool.wait_counts({"warming": 1})
    handle = pool.claim("t", "s1")  # takes over the spare still warming
    assert not handle.prewarmed
    pool.launcher.procs[handle.sandbox_id].popen.kill()  # dies before its bridge is up
    lost = pool.next_loss()
    assert (lost.session_id, lost.sandbox_id, lost.reason) == ("s1", handle.sandbox_id, LossReason.EXITED)
    assert lost.detail == "the sandbox's bridge did not start"
    wait_for(lambda: handle.sandbox_id in pool.launcher.destroyed, 30, "its sandbox destroyed")
    assert not pool.alive(handle)
    pool.launcher.release_all()
    pool.wait_counts({"warm": 1})  # the spare taken meanwhile is ready for the next session


def test_a_spare_whose_bridge_never_comes_up_is_replaced(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, ready_timeout=0.3, hold_bridges=True)  # no bridge binds its socket: every spare times out
    wait_for(lambda: pool.launcher.destroyed != [], 30, "the first spare given up")
    given_up = pool.launcher.destroyed[0]
    pool.launcher.release_all()
    pool.wait_counts({"warm": 1})  # another took its place without any claim asking
    assert not pool.alive_id(given_up)
    assert pool.lost.empty()  # nobody's sandbox: no session is told


def test_a_dead_spare_is_replaced_and_no_session_is_told(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, sweep_interval=3600.0)  # sweeps when told
    pool.wait_counts({"warm": 1})
    (spare,) = pool.launcher.procs
    pool.launcher.procs[spare].popen.kill()
    pool.launcher.procs[spare].popen.wait()
    pool.actor.sweep().get(timeout=ASK)
    pool.wait_counts({"warm": 1})
    assert len(pool.launcher.procs) == 2 and not pool.alive_id(spare)
    wait_for(lambda: spare in pool.launcher.destroyed, 30, "the dead spare cleaned up")
    assert pool.lost.empty()


def test_a_turn_never_starts_in_a_sandbox_that_died(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(sweep_interval=3600.0)  # before any sweep has noticed
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.launcher.procs[handle.sandbox_id].popen.kill()
    pool.launcher.procs[handle.sandbox_id].popen.wait()
    assert pool.alive(handle) is False
    assert pool.actor.mark_running(handle.sandbox_id).get(timeout=ASK) is False  # the session resumes cold


def test_spares_never_take_more_than_the_capacity(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=2, prewarm=3)
    pool.wait_counts({"warm": 2})
    handle = pool.claim("t", "s1")  # a spare taken: no room for another
    assert handle.prewarmed
    pool.ready(handle)
    pool.wait_counts({"waiting": 1, "warm": 1})
    pool.actor.release(handle.sandbox_id, True).get(timeout=ASK)  # room again: refilled at once
    pool.wait_counts({"warm": 2})


def test_a_sandbox_that_cannot_be_started_is_refused_without_host_details(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(launch_failure=OSError(2, "No such file or directory", "/srv/host/secret"))
    with pytest.raises(SandboxError) as refused:
        pool.claim("t", "s1", network=True)
    # A 500 that names the failure's kind; the host path is for the server log only.
    assert refused.value.status_code == 500
    assert "FileNotFoundError" in refused.value.message and "/srv" not in refused.value.message
    assert pool.counts() == {}
    pool.launcher.failure = CapacityError("no room on the data disk for the sandbox's disk image")
    with pytest.raises(CapacityError) as full:  # said as it is: 503, retry later
        pool.claim("t", "s2", network=True)
    assert full.value.message == "no room on the data disk for the sandbox's disk image"
    assert pool.counts() == {}
    wait_for(lambda: len(pool.launcher.destroyed) == 2, 30, "both half-made sandboxes cleaned up")
    pool.launcher.failure = None
    pool.ready(pool.claim("t", "s3", network=True))
    assert pool.counts() == {"waiting": 1}


def test_a_spare_that_cannot_be_started_is_dropped(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, launch_failure=OSError(28, "No space left on device"))
    wait_for(lambda: pool.launcher.destroyed != [], 30, "the failed spare cleaned up")
    assert pool.counts() == {} and pool.launcher.launches == 1  # not retried in a loop
    pool.launcher.failure = None
    handle = pool.claim("t", "s1")  # launched for the claim
    assert not handle.prewarmed
    pool.ready(handle)
    assert pool.counts() == {"waiting": 1}
    pool.actor.release(handle.sandbox_id).get(timeout=ASK)  # a release tries the spare again
    pool.wait_counts({"warm": 1})


def test_a_sandbox_that_cannot_be_cleaned_up_is_logged_and_the_pool_carries_on(
        make_pool: Callable[..., Pool], caplog: pytest.LogCaptureFixture) -> None:
    """The operator's only sign of leftover sandbox directories is this log line."""
    pool = make_pool()
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.launcher.destroy_failure = OSError(16, "Device or resource busy")
    with caplog.at_level(logging.ERROR, logger="ashd.actors._pool"):
        pool.actor.release(handle.sandbox_id).get(timeout=ASK)
        wait_for(lambda: any(r.getMessage() == "sandbox destroy failed" for r in caplog.records), 30,
                 "the failed destroy logged")
    record = next(r for r in caplog.records if r.getMessage() == "sandbox destroy failed")
    assert getattr(record, "sandboxId", None) == handle.sandbox_id and record.exc_info is not None
    assert pool.launcher.procs[handle.sandbox_id].poll() is not None  # its process is gone all the same
    pool.launcher.destroy_failure = None
    pool.ready(pool.claim("t", "s2"))
    assert pool.counts() == {"waiting": 1}


def test_a_spare_still_being_launched_counts_as_a_spare(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1)
    pool.wait_counts({"warm": 1})
    pool.launcher.launch_gate.clear()  # the next spare's launch takes long (disk image, exec)
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.wait_counts({"waiting": 1, "cold": 1})
    pool.actor.release(handle.sandbox_id).get(timeout=ASK)  # a refill: the cold one is the spare
    assert pool.counts() == {"cold": 1}
    pool.launcher.launch_gate.set()
    pool.wait_counts({"warm": 1})
    assert len(pool.launcher.procs) == 2  # the first spare and its one replacement


def test_a_spare_still_warming_is_not_taken_over_for_another_disk_size(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(disk_quota=True, prewarm=1, hold_bridges=True)
    pool.wait_counts({"warming": 1})
    (spare,) = pool.launcher.procs
    big: SandboxHandle = claimed(pool.actor.claim("t", "big", False, "default", 300 * 1024 * 1024).get(timeout=ASK))
    assert big.sandbox_id != spare and big.disk_bytes == 300 * 1024 * 1024
    pool.launcher.release_all()


def test_the_sweep_leaves_a_spare_being_launched_alone(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, idle_timeout=0.0, sweep_interval=3600.0, hold_launches=True)  # sweeps when told
    pool.wait_counts({"cold": 1})
    pool.actor.sweep().get(timeout=ASK)
    assert pool.counts() == {"cold": 1} and pool.lost.empty()
    pool.launcher.launch_gate.set()
    pool.wait_counts({"warm": 1})


def test_stopping_the_pool_while_a_spare_is_launched_leaves_no_process_behind(
        make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(prewarm=1, hold_launches=True)
    pool.wait_counts({"cold": 1})
    wait_for(lambda: pool.launcher.launches == 1, 30, "the spare's launch under way")
    stopper = threading.Thread(target=pool.ref.stop, kwargs={"block": True, "timeout": 60})
    stopper.start()
    wait_for(lambda: not pool.ref.is_alive(), 30, "the pool stopping")
    pool.launcher.launch_gate.set()  # the launch finishes after the pool has let the spare go
    stopper.join(60)
    assert not stopper.is_alive()
    (proc,) = pool.launcher.procs.values()
    assert proc.poll() is not None  # stopped by the pool, not left running
    assert list(pool.launcher.procs) == pool.launcher.destroyed


def test_a_spare_still_being_launched_is_evicted_first_and_stopped(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_capacity=1, prewarm=1, hold_launches=True)
    pool.wait_counts({"cold": 1})
    wait_for(lambda: pool.launcher.launches == 1, 30, "the spare's launch under way")
    claimed: list[SandboxHandle] = []
    # The claim's own launch waits at the gate too: it runs beside the test.
    claimer = threading.Thread(target=lambda: claimed.append(pool.claim("t", "s1", network=True)))
    claimer.start()
    wait_for(lambda: pool.launcher.launches == 2, 30, "the claim's launch under way")
    pool.launcher.launch_gate.set()
    claimer.join(60)
    (handle,) = claimed
    wait_for(lambda: len(pool.launcher.procs) == 2, 30, "the spare's launch returned")
    (spare,) = (sid for sid in pool.launcher.procs if sid != handle.sandbox_id)
    wait_for(lambda: spare in pool.launcher.destroyed, 30, "the evicted spare destroyed once launched")
    assert pool.launcher.procs[spare].poll() is not None  # its process did not outlive the eviction
    assert pool.counts() == {"warming": 1} and pool.lost.empty()
    pool.ready(handle)
    assert pool.counts() == {"waiting": 1}


def test_a_sandbox_kept_for_a_full_disk_is_tried_again_once_the_wait_is_over(
        make_pool: Callable[..., Pool], monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait (a minute) shortened to nothing: the next sweep after the refusal tries again.
    monkeypatch.setattr(pool_module, "_FULL_DISK_RETRY", 0.0)
    pool = make_pool(idle_timeout=1.0, sweep_interval=3600.0)  # sweeps when told
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.full_disk = True

    def swept() -> bool:
        pool.actor.sweep().get(timeout=ASK)
        return pool.refused != []

    wait_for(swept, 30, "a sweep trying the idle sandbox's snapshot")
    pool.full_disk = False
    pool.actor.sweep().get(timeout=ASK)  # not another idle timeout later: at once
    lost = pool.next_loss()
    assert (lost.session_id, lost.reason) == ("s1", LossReason.IDLE)
    assert pool.log == [("snapshot", "s1"), ("lost", "s1")]


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """The server's event loop, where the warmer keeps its bridge connections."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)
    loop.close()


def _held_by(warmer: Warmer, loop: asyncio.AbstractEventLoop, sandbox_id: str) -> asyncio.Task[Any] | None:
    """What a claimer of this sandbox would get from the warmer (asked on the loop, after what the
    pool told it before)."""
    async def take() -> asyncio.Task[Any] | None:
        return warmer.take(sandbox_id)

    return asyncio.run_coroutine_threadsafe(take(), loop).result(ASK)


def test_a_spare_destroyed_unclaimed_gives_up_its_warm_bridge_connection(
        loop_thread: asyncio.AbstractEventLoop, make_pool: Callable[..., Pool]) -> None:
    """Each warm spare holds a connection to its bridge (and a model-proxy socket); one evicted or
    stopped before any session took it must not keep them open for the life of the server."""
    warmer = Warmer(loop_thread, None, ASK)
    pool = make_pool(max_capacity=1, prewarm=1, bridge=True, warmer=warmer)
    pool.wait_counts({"warm": 1})
    (spare,) = pool.launcher.procs
    pool.claim("t", "s1", network=True)  # capacity 1: the spare makes room
    wait_for(lambda: spare in pool.launcher.destroyed, 30, "the spare destroyed")
    assert _held_by(warmer, loop_thread, spare) is None


def test_a_warm_spare_of_another_disk_size_is_not_handed_out(make_pool: Callable[..., Pool]) -> None:
    """With disk quotas a mounted disk cannot be resized: a smaller size than the spare's would
    silently get more disk, a larger one less than asked."""
    mib = 1024 * 1024
    pool = make_pool(disk_quota=True, prewarm=1)
    pool.wait_counts({"warm": 1})
    (spare,) = pool.launcher.procs
    for size in (300 * mib, 4096 * mib):
        handle: SandboxHandle = claimed(pool.actor.claim("t", f"s{size}", False, "default", size).get(timeout=ASK))
        assert not handle.prewarmed and handle.sandbox_id != spare and handle.disk_bytes == size
    assert pool.counts() == {"warm": 1, "warming": 2}


def test_the_idle_stop_is_logged_with_the_session_and_how_long_it_was_idle(
        make_pool: Callable[..., Pool], caplog: pytest.LogCaptureFixture) -> None:
    """The operator's record of a sandbox stopped for idleness: whose, and after how long."""
    pool = make_pool(idle_timeout=2.0, sweep_interval=0.02)
    handle = pool.claim("t", "s1")
    with caplog.at_level(logging.WARNING, logger="ashd.actors._pool"):
        configured = time.monotonic()
        pool.ready(handle)  # its idle clock starts
        assert pool.next_loss().session_id == "s1"

        def stopped() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage() == "idle session sandbox stopped"]

        wait_for(lambda: stopped() != [], 30, "the idle stop logged")  # just after the session is told
        elapsed = time.monotonic() - configured
    (record,) = stopped()
    assert (getattr(record, "sessionId", None), getattr(record, "sandboxId", None)) == ("s1", handle.sandbox_id)
    # Whole seconds: at least the timeout, at most what the test saw pass.
    assert 2 <= getattr(record, "idleSeconds", -1) <= elapsed


def test_sandbox_ids_have_the_shape_the_server_start_assumes(make_pool: Callable[..., Pool]) -> None:
    """The start-up check of SERVICE_DATA_DIR's length (the bridge socket's path lives under
    <data>/sandboxes/<id>/, and Unix socket paths are limited) counts on ids of exactly this length,
    and the rescue of a killed server's workspaces finds sandbox directories by their `sb-` prefix."""
    pool = make_pool(prewarm=1)
    pool.wait_counts({"warm": 1})
    ids = {pool.claim("t", "s1").sandbox_id, pool.claim("t", "s2", network=True).sandbox_id}
    assert len(ids) == 2
    for sandbox_id in ids:
        assert re.fullmatch(r"sb-[0-9a-f]{16}", sandbox_id), sandbox_id
        assert len(sandbox_id) == runtime_module._SANDBOX_ID_LEN


def test_a_claims_alive_check_answers_as_the_pool_does(make_pool: Callable[..., Pool]) -> None:
    """A warm resume asks its handle, not the pool, whether its sandbox is still there: yes while
    the session holds a live sandbox; no once its process died, or once the pool let it go."""
    pool = make_pool(sweep_interval=3600.0)  # sweeps when told: nothing notices the death for it
    dying = pool.claim("t", "dying")
    pool.ready(dying)
    released = pool.claim("t", "released")
    pool.ready(released)
    assert dying.alive is not None and released.alive is not None
    assert dying.alive() and released.alive()
    pool.launcher.procs[dying.sandbox_id].popen.kill()
    pool.launcher.procs[dying.sandbox_id].popen.wait()
    assert not dying.alive() and released.alive()
    pool.actor.release(released.sandbox_id).get(timeout=ASK)  # its destroy runs later, on a worker
    assert not released.alive()  # gone from the pool, whether or not its process is stopped yet


def test_a_release_never_holds_up_the_pool_behind_the_sandboxs_teardown(make_pool: Callable[..., Pool]) -> None:
    """A session's release returns at once: the shutdown ladder and the removal of its directories
    (an unmount, seconds on a busy host) run on a worker, and other sessions' claims go ahead."""
    pool = make_pool()
    handle = pool.claim("t", "s1")
    pool.ready(handle)
    pool.launcher.destroy_gate.clear()  # its teardown takes as long as the test wants
    pool.actor.release(handle.sandbox_id).get(timeout=ASK)
    other = pool.claim("t", "s2")
    pool.ready(other)
    assert pool.counts() == {"waiting": 1} and handle.sandbox_id not in pool.launcher.destroyed
    pool.launcher.destroy_gate.set()
    wait_for(lambda: handle.sandbox_id in pool.launcher.destroyed, 30, "its teardown finished")


def test_stopping_the_pool_returns_once_every_sandbox_is_torn_down(make_pool: Callable[..., Pool]) -> None:
    """The server's shutdown waits for the pool's stop: when it returns, no sandbox directory (a
    mounted disk) is left behind for the next start to clean up."""
    pool = make_pool(prewarm=1)
    pool.wait_counts({"warm": 1})
    pool.ready(pool.claim("t", "s1"))
    pool.wait_counts({"waiting": 1, "warm": 1})
    pool.launcher.destroy_gate.clear()  # the teardowns take as long as the test wants
    torn_down: list[list[str]] = []  # what was torn down when the stop returned

    def stop() -> None:
        pool.ref.stop(block=True, timeout=60)
        torn_down.append(list(pool.launcher.destroyed))

    stopper = threading.Thread(target=stop)
    stopper.start()
    wait_for(lambda: not pool.ref.is_alive(), 30, "the pool stopping")
    assert torn_down == []  # still waiting for the teardowns
    pool.launcher.destroy_gate.set()
    stopper.join(60)
    assert [sorted(ids) for ids in torn_down] == [sorted(pool.launcher.procs)]


def test_a_replacement_spare_waits_for_the_requests_in_flight(make_pool: Callable[..., Pool]) -> None:
    """A spare is for the next claim: it starts once the requests running now are done, not beside
    the claim's own session start and first message."""
    activity = Activity(quiet_s=0.01, at_most_s=60.0)
    pool = make_pool(prewarm=1, activity=activity)
    pool.wait_counts({"warm": 1})  # no request in flight: the first spare starts at once
    activity.begin()  # the create that claims it, still answering
    handle = pool.claim("t", "s1")
    assert handle.prewarmed
    time.sleep(0.3)
    assert pool.launcher.launches == 1 and pool.counts() == {"waiting": 1, "cold": 1}
    activity.end()
    pool.wait_counts({"waiting": 1, "warm": 1})
    assert pool.launcher.launches == 2


def test_a_busy_server_still_gets_its_spare(make_pool: Callable[..., Pool]) -> None:
    activity = Activity(quiet_s=0.01, at_most_s=0.2)
    pool = make_pool(prewarm=1, activity=activity)
    pool.wait_counts({"warm": 1})
    activity.begin()  # a stream that stays open
    pool.claim("t", "s1")
    pool.wait_counts({"waiting": 1, "warm": 1})  # after at most 0.2 s, busy or not
    assert activity.in_flight == 1


def test_a_claim_that_finds_no_spare_hurries_the_waiting_one(make_pool: Callable[..., Pool]) -> None:
    """A burst: the second create of a busy moment launches its own sandbox, and the spare that
    waited for quiet starts at once, for the third."""
    activity = Activity(quiet_s=0.01, at_most_s=60.0)
    pool = make_pool(prewarm=1, activity=activity)
    pool.wait_counts({"warm": 1})
    activity.begin()
    pool.ready(pool.claim("t", "s1"))
    fresh = pool.claim("t", "s2")
    assert not fresh.prewarmed
    pool.ready(fresh)
    pool.wait_counts({"waiting": 2, "warm": 1})  # still busy: the spare did not wait the 60 s
    assert pool.launcher.launches == 3


def _on(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
    asyncio.run_coroutine_threadsafe(_call(fn), loop).result(10)


async def _call(fn: Callable[[], Any]) -> None:
    fn()


def test_bound_to_the_loop_a_spare_waits_for_quiet_and_is_hurried_by_a_claim_without_one(
        make_pool: Callable[..., Pool], loop_thread: asyncio.AbstractEventLoop) -> None:
    """As the server runs it: the loop says when it is quiet, and the starter thread sleeps till then."""
    activity = Activity(quiet_s=0.01, at_most_s=60.0, loop=loop_thread)
    pool = make_pool(prewarm=1, activity=activity)
    pool.wait_counts({"warm": 1})
    _on(loop_thread, activity.begin)
    pool.ready(pool.claim("t", "s1"))
    time.sleep(0.3)
    assert pool.launcher.launches == 1 and pool.counts() == {"waiting": 1, "cold": 1}  # busy: it waits
    _on(loop_thread, activity.end)
    pool.wait_counts({"waiting": 1, "warm": 1})  # quiet: started
    assert pool.launcher.launches == 2

    _on(loop_thread, activity.begin)
    pool.ready(pool.claim("t", "s2"))  # takes the spare; its replacement waits for quiet
    fresh = pool.claim("t", "s3")  # none left: launched for it, and the waiting spare goes now
    assert not fresh.prewarmed
    pool.ready(fresh)
    pool.wait_counts({"waiting": 3, "warm": 1})  # still busy: the spare did not wait the 60 s
    _on(loop_thread, activity.end)
