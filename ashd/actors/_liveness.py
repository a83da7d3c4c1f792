"""Runner liveness on a coordinator: every SERVICE_RUNNER_SWEEP_SECONDS plus a random 0 to
SERVICE_RUNNER_SWEEP_JITTER_SECONDS, runners without a heartbeat for SERVICE_RUNNER_LIVENESS_SECONDS
are marked dead and their `active`/`starting` sessions paused (reason `runner_lost`).

Every coordinator runs one; the database decides which of them pauses a given runner's sessions
(`Runners.sweep_dead`). An asyncio task, not an actor: it only waits and talks to the database.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from ashd.metrics import Metrics
from ashd.storage import Runners, SweptRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LivenessConfig:
    liveness_seconds: float = 30.0
    sweep_seconds: float = 30.0
    jitter_seconds: float = 5.0


class RunnerLiveness:
    def __init__(self, runners: Runners, config: LivenessConfig, metrics: Metrics | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.runners = runners
        self.config = config
        self.metrics = metrics
        self._rand = rand
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="runner-liveness")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    def next_wait(self) -> float:
        return self.config.sweep_seconds + self._rand() * self.config.jitter_seconds

    async def sweep_once(self) -> list[SweptRunner]:
        swept = await self.runners.sweep_dead(self.config.liveness_seconds)
        if self.metrics is not None:
            self.metrics.runner_sweep(len(swept), sum(len(r.paused) for r in swept))
        for runner in swept:
            log.warning("runner stopped sending heartbeats: marked dead, its sessions paused",
                        extra={"runnerId": runner.runner_id, "pausedSessions": len(runner.paused),
                               "livenessSeconds": self.config.liveness_seconds})
        return swept

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.next_wait())
            try:
                await self.sweep_once()
            except Exception:  # a database hiccup: the next sweep tries again
                log.exception("runner liveness sweep failed; retrying at the next sweep")
