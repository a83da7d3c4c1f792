"""PoolActor with a real SandboxLauncher (zygote, real bridges): transitions, eviction, idle sweep,
loss detection, tenant separation and a clean stop. What HTTP cannot reach is tested here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pykka
import pytest

from ashd.actors._pool import PoolActor, PoolConfig, default_capacity
from ashd.actors._pool_types import Launching, LossReason, SandboxHandle, SandboxLost
from ashd.errors import CapacityError, SandboxError
from ashd.sandboxing import BridgeConnection, SandboxLauncher, SandboxSpec
from tests.fixtures.sandboxes import FIXTURES, TEST_LIMITS, require_isolation, started_launcher, wait_for

pytestmark = pytest.mark.sandbox
STATES = ("cold", "warming", "warm", "waiting", "running")
ASK = 30.0


class Harness:
    """A started pool plus what it told the outside: losses and snapshots, in order."""

    def __init__(self, launcher: SandboxLauncher, config: PoolConfig,
                 spec_for: Callable[[str, bool], SandboxSpec] | None = None) -> None:
        self.launcher = launcher
        self.lost: queue.Queue[SandboxLost] = queue.Queue()
        self.log: list[tuple[str, str]] = []  # ("snapshot" | "lost", session id)
        self.ref = PoolActor.start(config, launcher, spec_for or self._spec, self._snapshot, self._on_lost)
        self.pool = self.ref.proxy()
        self.board = self.pool.board.get(timeout=ASK)

    def _spec(self, sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id, self.launcher.paths_for(sandbox_id), env={"LANG": "C.UTF-8"},
                           limits=TEST_LIMITS, network=network)

    def _snapshot(self, session_id: str, workspace: Path) -> None:
        assert workspace.is_dir()  # the sandbox's files are still there when the snapshot is taken
        self.log.append(("snapshot", session_id))

    def _on_lost(self, lost: SandboxLost) -> None:
        self.log.append(("lost", lost.session_id))
        self.lost.put(lost)

    def stats(self) -> dict[str, int]:
        stats: dict[str, int] = self.pool.stats().get(timeout=ASK)
        assert stats["total"] == sum(stats[s] for s in STATES), stats  # the board is exact
        return stats

    def counts(self) -> dict[str, int]:
        stats = self.stats()
        return {s: stats[s] for s in STATES if stats[s]}

    def wait_counts(self, expected: dict[str, int]) -> None:
        wait_for(lambda: self.counts() == expected, 30, f"pool counts {expected}")

    def claim(self, tenant: str, session: str, network: bool = False) -> SandboxHandle:
        claimed = self.pool.claim(tenant, session, network).get(timeout=ASK)
        if isinstance(claimed, Launching):  # no spare: launched off the pool's thread
            claimed = claimed.handle.result(timeout=ASK)
        handle: SandboxHandle = claimed
        return handle

    def configure(self, handle: SandboxHandle) -> None:
        """What a session does after a claim: connect to the bridge (its answer, not the socket file,
        says it runs: the file is the launcher's from the start), then mark the sandbox ready."""
        async def hello() -> None:
            conn = await BridgeConnection.connect(str(handle.paths.bridge_socket), timeout=ASK)
            await conn.close()

        asyncio.run(hello())
        self.pool.mark_ready(handle.sandbox_id).get(timeout=ASK)

    def next_loss(self) -> SandboxLost:
        return self.lost.get(timeout=30)

    def stop(self) -> None:
        if self.ref.is_alive():
            self.ref.stop(block=True, timeout=60)


@pytest.fixture
def launcher(short_tmp: Path) -> Iterator[SandboxLauncher]:
    require_isolation()
    with started_launcher(short_tmp / "data", "zygote") as launcher:
        yield launcher


@pytest.fixture
def make_pool(launcher: SandboxLauncher) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(spec_for: Callable[[str, bool], SandboxSpec] | None = None, **config: Any) -> Harness:
        values: dict[str, Any] = {"max_capacity": 4, "prewarm": 0, "idle_timeout": 3600.0, "shutdown_grace": 1.0}
        values.update(config)
        harness = Harness(launcher, PoolConfig(**values), spec_for)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.stop()


def test_default_capacity_from_memory() -> None:
    gib = 1024**3
    assert default_capacity(512 * 1024**2, 24 * gib) == 48
    assert default_capacity(1024**2, 4096 * gib) == 1000  # capped
    assert default_capacity(64 * gib, 24 * gib) == 1  # never zero
    assert 1 <= default_capacity(512 * 1024**2) <= 1000  # this host


def test_prewarm_claim_run_release(make_pool: Callable[..., Harness]) -> None:
    h = make_pool(prewarm=1)
    # cold → warming → warm: on start the pool launches one generic sandbox and probes its bridge
    h.wait_counts({"warm": 1})
    handle = h.claim("t1", "s1")
    assert handle.prewarmed
    stats = h.stats()
    assert stats["preWarmHits"] == 1 and stats["waiting"] == 1
    h.wait_counts({"waiting": 1, "warm": 1})  # refilled after the claim
    h.configure(handle)
    assert h.pool.mark_running(handle.sandbox_id).get(timeout=ASK) is True
    assert h.counts() == {"running": 1, "warm": 1}
    h.pool.mark_waiting(handle.sandbox_id).get(timeout=ASK)
    assert h.counts() == {"waiting": 1, "warm": 1}
    h.pool.release(handle.sandbox_id, True).get(timeout=ASK)
    assert h.counts() == {"warm": 1}
    assert not handle.paths.root.exists()  # destroyed, never returned to the warm set
    assert h.pool.mark_running(handle.sandbox_id).get(timeout=ASK) is False


def test_fresh_claim_warming_to_waiting(make_pool: Callable[..., Harness]) -> None:
    h = make_pool()
    handle = h.claim("t1", "s1")
    assert not handle.prewarmed
    assert h.counts() == {"warming": 1}
    h.configure(handle)
    assert h.counts() == {"waiting": 1}
    assert h.stats()["preWarmHits"] == 0


def test_claims_with_no_spare_are_answered_before_their_launches(make_pool: Callable[..., Harness]) -> None:
    """A claim that finds no spare is answered at once (`Launching`) and launched off the pool's
    thread, so a burst of them launches side by side and the pool answers meanwhile."""
    h = make_pool()
    answers = [h.pool.claim("t", f"s{n}").get(timeout=ASK) for n in range(3)]
    assert all(isinstance(a, Launching) for a in answers)
    assert h.stats()["total"] == 3  # counted (capacity) and assigned from the claim on
    handles = [a.handle.result(timeout=ASK) for a in answers]
    assert [hd.sandbox_id for hd in handles] == [a.sandbox_id for a in answers]
    assert h.counts() == {"warming": 3}
    for handle in handles:
        h.configure(handle)
        assert h.pool.mark_running(handle.sandbox_id).get(timeout=ASK) is True
    assert h.counts() == {"running": 3}


def test_a_sandbox_released_while_it_launches_is_destroyed(make_pool: Callable[..., Harness]) -> None:
    h = make_pool()
    launching = h.pool.claim("t", "gave-up").get(timeout=ASK)
    assert isinstance(launching, Launching)
    h.pool.release(launching.sandbox_id).get(timeout=ASK)  # the session stopped before the launch ended
    with contextlib.suppress(SandboxError):  # released before or after the launch: either way it goes
        launching.handle.result(timeout=ASK)
    assert h.counts() == {}
    paths = h.launcher.paths_for(launching.sandbox_id)
    wait_for(lambda: not paths.root.exists(), 30, "the released sandbox's directories to go")
    assert not any(launching.sandbox_id in " ".join(p.info["cmdline"] or ())
                   for p in psutil.process_iter(["cmdline"]))


def test_a_launch_that_fails_is_the_claims_answer(make_pool: Callable[..., Harness],
                                                   launcher: SandboxLauncher) -> None:
    def refuse(sandbox_id: str, network: bool) -> SandboxSpec:
        raise OSError(28, "No space left on device: /srv/secret/path")

    h = make_pool(spec_for=refuse)
    launching = h.pool.claim("t", "s1").get(timeout=ASK)
    assert isinstance(launching, Launching)
    with pytest.raises(SandboxError, match="could not be started \\(OSError\\); the details are in the server log"):
        launching.handle.result(timeout=ASK)
    assert h.counts() == {}  # nothing left counted against the capacity
    wait_for(lambda: not launcher.paths_for(launching.sandbox_id).root.exists(), 30, "its directories to go")


def test_claim_takes_over_a_generic_sandbox_still_warming(make_pool: Callable[..., Harness]) -> None:
    # capacity 1 with one pre-warm: the only slot is the generic sandbox, whether warm yet or not
    h = make_pool(max_capacity=1, prewarm=1)
    handle = h.claim("t1", "s1")
    h.configure(handle)
    assert h.counts() == {"waiting": 1}


def test_eviction_order_and_capacity(make_pool: Callable[..., Harness]) -> None:
    h = make_pool(max_capacity=3, prewarm=1)
    h.wait_counts({"warm": 1})
    s1 = h.claim("t", "s1")
    h.wait_counts({"waiting": 1, "warm": 1})
    s2 = h.claim("t", "s2")
    h.wait_counts({"waiting": 2, "warm": 1})  # full: 3 of 3
    h.configure(s1)
    h.configure(s2)  # s1 is now the oldest waiting
    # A network sandbox is never pre-warmed: it needs room, and the warm one goes first.
    s3 = h.claim("t", "s3", network=True)
    assert h.counts() == {"waiting": 2, "warming": 1}
    assert h.lost.empty()
    h.configure(s3)
    s4 = h.claim("t", "s4", network=True)  # then the oldest waiting one, snapshotted first
    lost = h.next_loss()
    assert (lost.session_id, lost.reason) == ("s1", LossReason.EVICTED)
    assert h.log == [("snapshot", "s1"), ("lost", "s1")]
    assert h.pool.mark_running(s1.sandbox_id).get(timeout=ASK) is False
    wait_for(lambda: not s1.paths.root.exists(), 30, "evicted sandbox destroyed")
    h.configure(s4)
    for handle in (s2, s3, s4):
        assert h.pool.mark_running(handle.sandbox_id).get(timeout=ASK)
    with pytest.raises(CapacityError):  # running sandboxes are never evicted
        h.claim("t", "s5")
    assert h.counts() == {"running": 3}
    assert h.lost.empty()


def test_sandbox_being_configured_is_not_evicted(make_pool: Callable[..., Harness]) -> None:
    h = make_pool(max_capacity=1)
    h.claim("t", "s1")  # claimed, not yet configured (mark_ready not called)
    with pytest.raises(CapacityError):
        h.claim("t", "s2")


def test_idle_sweep_spares_running_turns(make_pool: Callable[..., Harness]) -> None:
    h = make_pool(idle_timeout=0.3, sweep_interval=0.05)
    busy = h.claim("t", "busy")
    h.configure(busy)
    assert h.pool.mark_running(busy.sandbox_id).get(timeout=ASK)
    idle = h.claim("t", "idle")
    h.configure(idle)  # idle's clock starts after busy's turn started
    lost = h.next_loss()
    assert (lost.session_id, lost.reason) == ("idle", LossReason.IDLE)
    assert h.log[:2] == [("snapshot", "idle"), ("lost", "idle")]
    # busy's turn has now run longer than the idle timeout and is still there
    assert h.counts() == {"running": 1}
    assert h.pool.is_alive(busy.sandbox_id).get(timeout=ASK)
    h.pool.mark_waiting(busy.sandbox_id).get(timeout=ASK)  # turn over: the idle clock restarts
    lost = h.next_loss()
    assert (lost.session_id, lost.reason) == ("busy", LossReason.IDLE)
    h.wait_counts({})


def test_sandbox_dying_while_waiting_is_detected(make_pool: Callable[..., Harness],
                                                 launcher: SandboxLauncher) -> None:
    h = make_pool(sweep_interval=0.05)
    handle = h.claim("t", "s1")
    h.configure(handle)
    proc = launcher._running[handle.sandbox_id]
    proc.send_signal(signal.SIGKILL)  # the payload dies (as under the OOM killer); the monitor reports
    lost = h.next_loss()
    assert (lost.session_id, lost.reason) == ("s1", LossReason.EXITED)
    assert "signal 9" in lost.detail or "memory" in lost.detail
    h.wait_counts({})
    assert h.pool.is_alive(handle.sandbox_id).get(timeout=ASK) is False


def test_tenants_never_share_a_sandbox(make_pool: Callable[..., Harness]) -> None:
    h = make_pool(max_capacity=6, prewarm=1)
    h.wait_counts({"warm": 1})
    used_by_a: set[str] = set()
    live = h.claim("tenant-a", "a-live")  # tenant A keeps this one while B claims
    h.configure(live)
    used_by_a.add(live.sandbox_id)
    for n in range(2):
        h.wait_counts({"waiting": 1, "warm": 1})
        handle = h.claim("tenant-a", f"a{n}")
        h.configure(handle)
        used_by_a.add(handle.sandbox_id)
        h.pool.release(handle.sandbox_id, True).get(timeout=ASK)
        assert not handle.paths.root.exists()
    h.wait_counts({"waiting": 1, "warm": 1})
    for n in range(3):
        handle = h.claim("tenant-b", f"b{n}")
        assert handle.sandbox_id not in used_by_a
        h.configure(handle)
    assert h.pool.is_alive(live.sandbox_id).get(timeout=ASK) and h.lost.empty()


def test_pool_answers_while_a_sandbox_is_destroyed(make_pool: Callable[..., Harness],
                                                   launcher: SandboxLauncher) -> None:
    def stubborn(sandbox_id: str, network: bool) -> SandboxSpec:
        paths = launcher.paths_for(sandbox_id)
        (paths.workspace / "ladder_double.py").write_bytes((FIXTURES / "ladder_double.py").read_bytes())
        return SandboxSpec(sandbox_id, paths, limits=TEST_LIMITS,
                           argv=(sys.executable, "-I", "/workspace/ladder_double.py", "stubborn"))

    h = make_pool(stubborn, shutdown_grace=5.0)
    handle = h.claim("t", "s1")
    try:
        wait_for(handle.paths.bridge_socket.exists, 30, "double listening")
    except AssertionError:
        log = handle.paths.logs / "sandbox.log"
        run = handle.paths.run
        raise AssertionError(f"the double did not listen: {log.read_text() if log.exists() else 'no log'}; "
                             f"its run dir: {oct(os.stat(run).st_mode) if run.exists() else 'none'}") from None
    proc = launcher._running[handle.sandbox_id]
    h.pool.release(handle.sandbox_id).get(timeout=ASK)
    # The ladder now waits 5 s on SIGTERM, which this payload ignores; the pool answers meanwhile.
    assert h.counts() == {}
    assert proc.poll() is None
    proc.wait(timeout=30)


def test_stop_leaves_nothing_behind(make_pool: Callable[..., Harness], launcher: SandboxLauncher) -> None:
    h = make_pool(prewarm=2)
    h.wait_counts({"warm": 2})
    handle = h.claim("t", "s1")
    h.configure(handle)
    h.wait_counts({"waiting": 1, "warm": 2})
    # A pool without a warmer counts a spare warm once launched (`_readiness.py`): its process may
    # not have joined its cgroup yet (v1: it writes itself into it after the fork).
    procs = list(launcher._running.values())
    assert len(procs) == 3
    wait_for(lambda: all(proc.sandbox_pids() for proc in procs), 10, "each sandbox's process in its cgroup")
    pids = [pid for proc in procs for pid in proc.sandbox_pids()]
    h.stop()
    assert launcher._running == {}
    sandboxes = launcher.sandboxes_dir
    assert [p.name for p in sandboxes.iterdir() if p.name.startswith("sb-")] == []
    assert list(sandboxes.rglob("*.sock")) == []
    cgroups = launcher._cgroups
    if cgroups is not None:
        assert cgroups.existing() == []
    import psutil

    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"] == []


def test_stopped_pool_refuses_work(make_pool: Callable[..., Harness]) -> None:
    h = make_pool()
    h.stop()
    with pytest.raises(pykka.ActorDeadError):
        h.claim("t", "s1")
