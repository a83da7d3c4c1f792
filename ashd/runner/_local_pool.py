"""A coordinator's local pool (SERVICE_COORDINATOR_LOCAL) as a runner: the runner API on
SERVICE_RUNNER_PORT and a row in the runners table, heartbeated like `ashd runner`'s.

Its sessions carry its runner id (the coordinator's `sandbox_owner_id`), so every coordinator
behind the balancer routes a request for one of them to this pool (the others through this runner
API), never to a second sandbox of its own; and when this coordinator dies, the others' liveness
sweep pauses its sessions, which resume cold elsewhere, as a dead runner's do. The coordinator
shares the database, so it registers and heartbeats there directly, not over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from aiohttp import web

from ashd import runtime
from ashd.actors import LOCAL_POOL_STAT
from ashd.errors import NotFound
from ashd.http import RunnerApiState, build_runner_app
from ashd.runner._registration import RunnerIdentity
from ashd.storage import Database, Runners

log = logging.getLogger(__name__)


class LocalPoolRunner:
    def __init__(self, db: Database, local: runtime.LocalSessions, identity: RunnerIdentity, secret: str,
                 heartbeat_seconds: float, grace_seconds: float, max_body_bytes: int) -> None:
        self._runners = Runners(db)
        self._local = local
        self.identity = identity
        self._every = heartbeat_seconds
        self._grace = grace_seconds
        self.state = RunnerApiState(local.backend, secret, identity.runner_id, local.pool.board.read, max_body_bytes,
                                    activity=local.activity)
        self._site_runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, host: str) -> None:
        self._site_runner = web.AppRunner(build_runner_app(self.state), handle_signals=False, access_log=None,
                                          shutdown_timeout=self._grace)
        await self._site_runner.setup()
        await web.TCPSite(self._site_runner, host, self.identity.port, reuse_address=True).start()
        await self._register()
        self._task = asyncio.get_running_loop().create_task(self._heartbeats())
        log.info("local pool registered as a runner", extra={
            "runnerId": self.identity.runner_id, "host": self.identity.host, "port": self.identity.port})

    async def _register(self) -> None:
        ident = self.identity
        await self._runners.register(ident.runner_id, ident.host, ident.port, ident.max_sandboxes)
        await self._beat()  # at once: the stats mark the row as a local pool (placed after runners)

    async def _beat(self) -> None:
        stats = {k: int(v) for k, v in self._local.pool.board.read().items()}
        stats[LOCAL_POOL_STAT] = 1
        await self._runners.heartbeat(self.identity.runner_id, stats, self._local.registry.live_actors())

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                try:
                    await self._beat()
                except NotFound:  # marked dead by a sweep (its sessions were paused): back in the registry
                    log.warning("the local pool was marked dead; registering it again",
                                extra={"runnerId": self.identity.runner_id})
                    await self._register()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is briefly away: the next beat tries again
                log.exception("local pool heartbeat failed", extra={"runnerId": self.identity.runner_id})

    async def stop_heartbeats(self) -> None:
        """No more heartbeats (as if the process died); `stop` still does the rest."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def stop(self) -> None:
        """Graceful, as `ashd runner`'s: no new sessions here, this pool's sessions paused (their
        snapshots taken), the row removed, then the runner API closed."""
        self.state.draining = True
        await self.stop_heartbeats()
        try:
            async with asyncio.timeout(max(30.0, self._grace * 2)):
                await self._local.backend.pause_all()
        except TimeoutError:
            log.warning("pausing the local pool's sessions took too long; deregistering anyway")
        with suppress(NotFound):  # already swept and removed
            await self._runners.deregister(self.identity.runner_id)
        if self._site_runner is not None:
            await self._site_runner.cleanup()
            self._site_runner = None
