"""RunnerRegistryActor: a coordinator's view of the registered runners, and where a new session goes.

The shared database is the truth (every coordinator reads the same `runners` table); this actor only
keeps a copy for `ttl` seconds so that routing a request costs no query. It counts the sessions it
placed on each runner since that runner's last heartbeat (whose counts include them from then on),
so that a burst of creates spreads over the runners instead of all going to the one that looked
emptiest at the last heartbeat, however many times the table is read meanwhile.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from ashd.actors._staged import Stage, StagedActor, staged

# In a runner's heartbeat stats: 1 for a coordinator's local pool (ashd/runner/_local_pool.py).
LOCAL_POOL_STAT = "coordinatorLocal"


@dataclass(frozen=True)
class RunnerInfo:
    """One registered runner as routing sees it."""

    runner_id: str
    host: str
    port: int
    max_sandboxes: int
    running: int
    warming: int
    last_heartbeat: dt.datetime
    dead: bool = False  # a liveness sweep marked it dead: alive again only once it registers again
    local_pool: bool = False  # a coordinator's local pool (SERVICE_COORDINATOR_LOCAL): a fallback

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"

    def available(self, placed: int = 0) -> int:
        """Free capacity: maximum sandboxes minus running and warming ones (and those placed since)."""
        return self.max_sandboxes - self.running - self.warming - placed

    def alive(self, now: dt.datetime, liveness_seconds: float) -> bool:
        return not self.dead and (now - self.last_heartbeat).total_seconds() <= liveness_seconds

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RunnerInfo:
        stats = row.get("stats") or {}
        beat = dt.datetime.fromisoformat(str(row["lastHeartbeatAt"]))
        if beat.tzinfo is None:
            beat = beat.replace(tzinfo=dt.UTC)
        return cls(runner_id=str(row["runnerId"]), host=str(row["host"]), port=int(row["port"]),
                   max_sandboxes=int(row.get("maxSandboxes") or 0),
                   running=int(stats.get("running", row.get("runningCount", 0)) or 0),
                   warming=int(stats.get("warming", row.get("warmingCount", 0)) or 0), last_heartbeat=beat,
                   dead=row.get("deadAt") is not None, local_pool=bool(stats.get(LOCAL_POOL_STAT)))


def choose(runners: Sequence[RunnerInfo], now: dt.datetime, liveness_seconds: float,
           placed: dict[str, int] | None = None, exclude: frozenset[str] = frozenset()) -> RunnerInfo | None:
    """The alive runner with the most available capacity (ties: the lowest id, so every coordinator
    agrees), or None when no runner is alive. Coordinators' local pools only when no runner
    (`ashd runner`) has room: they are the fallback SERVICE_COORDINATOR_LOCAL promises.

    When none seems to have room, the one with the most is still chosen: what this coordinator
    knows is a heartbeat up to SERVICE_RUNNER_HEARTBEAT_SECONDS old plus every session it placed
    since, counted as running though most may have ended. A coordinator that refused on that
    estimate answered 503 to a steady stream of short sessions on idle runners; the runner itself
    refuses at the door when it is full (`X-Runner-Full`), and the create goes on to the next."""
    placed = placed or {}
    fallback: RunnerInfo | None = None
    for local_pools in (False, True):
        best: RunnerInfo | None = None
        for runner in sorted(runners, key=lambda r: r.runner_id):
            if (runner.local_pool != local_pools or runner.runner_id in exclude
                    or not runner.alive(now, liveness_seconds)):
                continue
            if best is None or runner.available(placed.get(runner.runner_id, 0)) > best.available(
                    placed.get(best.runner_id, 0)):
                best = runner
        if best is not None and best.available(placed.get(best.runner_id, 0)) > 0:
            return best
        fallback = fallback or best
    return fallback


class RunnerRegistryActor(StagedActor):
    """Asked from the event loop (`call(proxy.pick(), timeout)`); reads the database on the loop, as
    a stage of the request that needs it (`_staged.py`): its thread never waits for the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read: Callable[[], Coroutine[Any, Any, list[dict[str, Any]]]],
                 liveness_seconds: float, ttl: float = 1.0, timeout: float = 30.0,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        super().__init__(loop, timeout)
        self._read = read  # the runners table, as Runners.list() answers it
        self._liveness = liveness_seconds
        self._ttl = ttl
        self._clock = clock
        self._runners: list[RunnerInfo] = []
        self._read_at = float("-inf")
        self._placed: dict[str, list[dt.datetime]] = {}  # runner id -> when each session went there

    def _fresh(self, force: bool = False) -> Stage[list[RunnerInfo]]:
        if force or time.monotonic() - self._read_at > self._ttl:
            rows = yield self._read()
            self._runners = [RunnerInfo.from_json(r) for r in rows]
            self._read_at = time.monotonic()
            beats = {r.runner_id: r.last_heartbeat for r in self._runners}
            # A heartbeat's counts include what was placed before it: only later placements still add.
            self._placed = {rid: later for rid, times in self._placed.items() if rid in beats
                            and (later := [t for t in times if t > beats[rid]])}
        return self._runners

    @staged
    def pick(self, exclude: frozenset[str] = frozenset()) -> Stage[RunnerInfo | None]:
        """The runner a new (or cold-resumed) session goes to, counted as placed there."""
        runners = yield from self._fresh()
        placed = {rid: len(times) for rid, times in self._placed.items()}
        runner = choose(runners, self._clock(), self._liveness, placed, exclude)
        if runner is not None:
            self._placed.setdefault(runner.runner_id, []).append(self._clock())
        return runner

    @staged
    def address(self, runner_id: str) -> Stage[RunnerInfo | None]:
        """The runner, when it is registered and alive; None otherwise (gone, or silent too long)."""
        for attempt in (False, True):  # a runner registered since the last read: read again once
            for runner in (yield from self._fresh(force=attempt)):
                if runner.runner_id == runner_id:
                    return runner if runner.alive(self._clock(), self._liveness) else None
            if time.monotonic() - self._read_at < min(self._ttl, 0.2):
                break  # just read: no need to read again
        return None

    @staged
    def alive(self) -> Stage[list[RunnerInfo]]:
        runners = yield from self._fresh()
        now = self._clock()
        return [r for r in runners if r.alive(now, self._liveness)]

    def forget(self) -> None:
        """Read the table again at the next question (a runner failed to answer)."""
        self._read_at = float("-inf")
