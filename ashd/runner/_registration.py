"""A runner's registration with its coordinator: register (retried with capped, jittered exponential
backoff), heartbeat with the pool's counts, register again when the coordinator no longer knows
it (404), and deregister on a graceful stop. All through SERVICE_SERVER_URL (a coordinator or the
load balancer in front of several), with the internal secret."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger(__name__)
_FIRST_DELAY = 0.2
_TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclass(frozen=True)
class RunnerIdentity:
    runner_id: str
    host: str  # what coordinators use to reach the runner API
    port: int
    max_sandboxes: int


class Registration:
    def __init__(self, server_url: str, secret: str, identity: RunnerIdentity, heartbeat_seconds: float,
                 pool_stats: Callable[[], Mapping[str, int]], active_count: Callable[[], int]) -> None:
        self._base = server_url.rstrip("/") + "/api/internal/runners"
        self._secret = secret
        self.identity = identity
        self._every = heartbeat_seconds
        self._max_delay = max(1.0, heartbeat_seconds)  # backoff cap: no slower than the heartbeat
        self._pool_stats = pool_stats
        self._active_count = active_count
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self.registered = asyncio.Event()

    def start(self) -> None:
        self._http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self._secret}"}, timeout=_TIMEOUT)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _post(self, what: str, body: dict[str, Any]) -> int:
        assert self._http is not None
        async with self._http.post(f"{self._base}/{what}", json=body) as resp:
            if resp.status >= 400 and resp.status != 404:
                text = (await resp.text())[:300]
                log.warning("coordinator refused the runner's %s: HTTP %d %s", what, resp.status, text,
                            extra={"runnerId": self.identity.runner_id})
            return resp.status

    async def _register(self) -> None:
        """Until the coordinator takes it: retried with exponential backoff, capped and jittered."""
        ident = self.identity
        body = {"runnerId": ident.runner_id, "host": ident.host, "port": ident.port,
                "maxSandboxes": ident.max_sandboxes}
        delay = _FIRST_DELAY
        while True:
            try:
                if await self._post("register", body) == 200:
                    log.info("registered with the coordinator", extra={"runnerId": ident.runner_id,
                                                                        "server": self._base})
                    self.registered.set()
                    return
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.info("coordinator not reachable yet; registering again in %.1f s: %s", delay, exc,
                         extra={"runnerId": ident.runner_id})
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._max_delay)

    async def _run(self) -> None:
        await self._register()
        while True:
            await asyncio.sleep(self._every)
            stats = dict(self._pool_stats())
            body = {"runnerId": self.identity.runner_id, "activeCount": self._active_count(),
                    "stats": {k: int(v) for k, v in stats.items()}}
            try:
                status = await self._post("heartbeat", body)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("heartbeat failed: %s", exc, extra={"runnerId": self.identity.runner_id})
                continue
            if status == 404:  # the coordinator forgot this runner (marked dead, or a new database)
                log.warning("coordinator does not know this runner; registering again",
                            extra={"runnerId": self.identity.runner_id})
                self.registered.clear()
                await self._register()

    async def stop(self, deregister: bool) -> None:
        """Stop heartbeating; with `deregister`, tell the coordinator (it pauses this runner's sessions)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if deregister and self._http is not None:
            try:
                status = await self._post("deregister", {"runnerId": self.identity.runner_id})
                log.info("deregistered from the coordinator", extra={"runnerId": self.identity.runner_id,
                                                                      "status": status})
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("could not deregister (the coordinator's liveness sweep will): %s", exc,
                            extra={"runnerId": self.identity.runner_id})
        if self._http is not None:
            await self._http.close()
            self._http = None
