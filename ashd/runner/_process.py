"""The runner process: storage (the shared database) → actors and sandboxes (`runtime.start`, with
this runner's id) → the runner API → registration. Stop (SIGTERM): refuse new sessions, let running
turns finish (SERVICE_SHUTDOWN_GRACE_SECONDS), deregister, then stop everything in reverse order."""

from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import web

from ashd import __version__, runtime
from ashd._bootstrap import ensure_internal_secret, prepare_data_dir
from ashd._heap import settle as settle_heap
from ashd._signals import StopStep, run_until_signalled, unwind
from ashd.components import coordinator_id
from ashd.config import Settings
from ashd.errors import ConfigError
from ashd.event_loop import running_loop_name
from ashd.http import RunnerApiState, build_runner_app
from ashd.metrics import Metrics
from ashd.runner._registration import Registration, RunnerIdentity
from ashd.storage import MIB, Agents, Cipher, Credentials, Database, load_or_create_key

log = logging.getLogger(__name__)


def runner_id_of(settings: Settings) -> str:
    """SERVICE_RUNNER_ID, else one stable across restarts of this runner (host name and port), so a
    restarted runner finds its own sessions."""
    return settings.runner_id or f"{socket.gethostname()}-{settings.runner_port}"


def advertised_host(settings: Settings) -> str:
    if settings.runner_advertise_host:
        return settings.runner_advertise_host
    if settings.host not in ("0.0.0.0", "::", ""):
        return settings.host
    return socket.gethostname()


class RunnerProcess:
    def __init__(self, settings: Settings) -> None:
        if not settings.server_url:
            raise ConfigError("`ashd runner` needs SERVICE_SERVER_URL: the coordinator (or its load balancer) to "
                              "register with")
        if not settings.database_url:
            raise ConfigError("`ashd runner` needs SERVICE_DATABASE_URL: the coordinators' database (PostgreSQL), "
                              "where the sessions it runs are stored; a private embedded database would hide them")
        # The id is also the owner of this runner's sandboxes (its start-up sweep pauses only those).
        self.runner_id = runner_id_of(settings)
        self.settings = settings = settings.with_(runner_id=self.runner_id)
        self.state: RunnerApiState | None = None
        self.local: runtime.LocalSessions | None = None
        self.registration: Registration | None = None
        self._stops: list[tuple[str, StopStep]] = []
        self._site_runner: web.AppRunner | None = None

    async def start(self) -> None:
        settings = self.settings
        data = prepare_data_dir(settings)
        db = await Database.open(settings.effective_database_url)
        self._stops.append(("database", db.close))
        secret = ensure_internal_secret(settings)
        # The coordinator encrypted the session's environment and the credentials: the same key is needed.
        cipher = Cipher(load_or_create_key(settings.credential_key, data))
        agents = Agents(db, cipher, settings.data_path, settings.agent_root_paths, settings.agent_max_upload_mb * MIB)
        parts = runtime.StorageParts(settings, db, cipher, agents, Credentials(db, cipher), Metrics(),
                                     coordinator_id())
        local = self.local = await runtime.start(parts, self._stops, runner_id=self.runner_id)
        self.state = RunnerApiState(local.backend, secret, self.runner_id, local.pool.board.read,
                                    settings.max_body_bytes * 2, activity=local.activity)
        self._site_runner = web.AppRunner(build_runner_app(self.state), handle_signals=False, access_log=None,
                                          shutdown_timeout=settings.shutdown_grace_seconds)
        await self._site_runner.setup()
        await web.TCPSite(self._site_runner, settings.host, settings.runner_port, reuse_address=True).start()
        stats = local.pool.board.read
        identity = RunnerIdentity(self.runner_id, advertised_host(settings), settings.runner_port,
                                  int(stats().get("maxCapacity", 0)))
        assert settings.server_url is not None
        self.registration = Registration(settings.server_url, secret, identity, settings.runner_heartbeat_seconds,
                                         stats, local.registry.live_actors)
        self.registration.start()
        log.info("runner listening", extra={"runnerId": self.runner_id, "host": settings.host,
                                            "port": settings.runner_port, "advertise": identity.host,
                                            "version": __version__, "server": settings.server_url,
                                            "eventLoop": running_loop_name()})

    async def _pause_sessions(self) -> None:
        """Snapshot and pause this runner's sessions before its sandboxes go (bounded: the liveness
        rules cover a runner that cannot finish this)."""
        if self.local is None:
            return
        try:
            async with asyncio.timeout(max(30.0, self.settings.shutdown_grace_seconds * 2)):
                paused = await self.local.backend.pause_all()
        except TimeoutError:
            log.warning("pausing the runner's sessions took too long; deregistering anyway")
            return
        log.info("paused this runner's sessions", extra={"runnerId": self.runner_id, "count": paused})

    async def stop(self) -> None:
        """Graceful: no new sessions, running turns finish (bounded), deregister, then the rest."""
        if self.state is not None:
            self.state.draining = True
            await runtime.drain(self.state.backend, self.settings.shutdown_grace_seconds)
            await self._pause_sessions()
        if self.registration is not None:
            await self.registration.stop(deregister=True)
        if self._site_runner is not None:
            await self._site_runner.cleanup()
            self._site_runner = None
        await unwind(self._stops)
        log.info("runner stopped", extra={"runnerId": self.runner_id})


async def run_runner(settings: Settings) -> None:
    process = RunnerProcess(settings)

    async def start() -> None:
        await process.start()
        settle_heap()  # this process is the runner: what its start built lives as long as it does

    await run_until_signalled(start, process.stop, log, "stop requested; draining the runner")
