"""Builds and runs the process: storage → actors → HTTP, and the reverse on stop.

Each step that starts something registers its stop; `stop()` runs them in reverse order and keeps
going past a failing step, so one broken component never leaves the others running.
"""

from __future__ import annotations

import logging
import platform
import sys
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ashd import __version__
from ashd._bootstrap import ensure_api_keys, ensure_internal_secret, prepare_data_dir
from ashd._heap import settle as settle_heap
from ashd._signals import StopStep, run_until_signalled, unwind
from ashd.actors import EMPTY_POOL_STATS
from ashd.backends import SessionBackend
from ashd.components import Components, coordinator_id
from ashd.config import Settings
from ashd.event_loop import running_loop_name
from ashd.http import build_app, configuration_warnings
from ashd.metrics import Metrics
from ashd.storage import (
    MIB,
    Agents,
    ApiKeys,
    Cipher,
    Credentials,
    Database,
    DataDirSpace,
    SnapshotBoard,
    TenantStorage,
    load_or_create_key,
)

if TYPE_CHECKING:
    from ashd.runtime import LocalSessions

log = logging.getLogger(__name__)


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.components: Components | None = None
        self.app: web.Application | None = None
        self._stops: list[tuple[str, StopStep]] = []
        self._runner: web.AppRunner | None = None
        self.local_runner: Any = None  # SERVICE_COORDINATOR_LOCAL: the pool's LocalPoolRunner

    async def start_components(self) -> Components:
        """Storage, then actors, then the HTTP application; everything but the listening socket
        (tests use this with their own client). Each step registers its stop as it succeeds."""
        settings = self.settings
        # Storage.
        data = prepare_data_dir(settings)
        db = await Database.open(settings.effective_database_url)
        self._stops.append(("database", db.close))
        keys = await ApiKeys.open(db)
        await ensure_api_keys(settings, keys)
        cipher = Cipher(load_or_create_key(settings.credential_key, data))
        internal_secret = ensure_internal_secret(settings)
        agents = Agents(db, cipher, settings.data_path, settings.agent_root_paths,
                        settings.agent_max_upload_mb * MIB,
                        sole_writer=db.dialect == "sqlite")  # SQLite is never shared (docs/deployment.md)
        await agents.import_local_folders()  # managed folders from before they were stored in the database
        credentials = Credentials(db, cipher)
        data_space = DataDirSpace(data, settings.data_dir_min_free_mb * MIB, settings.data_dir_warn_free_mb * MIB)
        metrics = Metrics()
        server_id = coordinator_id()
        for warning in await configuration_warnings(settings, db):
            log.warning(warning)
        # Actors and sandboxes; imported late to keep the CLI light.
        from ashd import runtime

        parts = runtime.StorageParts(settings, db, cipher, agents, credentials, metrics, server_id)
        backend: SessionBackend
        if settings.mode == "coordinator":  # sessions run on runners (and here only as a fallback)
            coordinator = await runtime.start_coordinator(parts, self._stops)
            local, backend = coordinator.local, coordinator.backend
            if local is not None:
                await self._start_local_runner(db, local, internal_secret)
        else:
            local = await runtime.start(parts, self._stops)
            backend = local.backend
        runtime.start_runner_liveness(settings, db, metrics, self._stops)
        # Webhook deliveries: every process with a database sends from the shared outbox (leases keep
        # two from sending one), a coordinator without a local pool too.
        webhooks = local.webhooks if local is not None and local.webhooks is not None else (
            runtime.start_webhooks(parts, self._stops))
        tenant_storage = TenantStorage(db, local.snapshot_board if local else SnapshotBoard(), settings)
        # Queued prompts run through the same seam as POST .../messages: on a runner in coordinator mode.
        queue = runtime.start_queue(parts, backend, tenant_storage, self._stops, webhooks)
        # HTTP.
        components = Components(
            settings=settings, db=db, api_keys=keys, cipher=cipher, agents=agents, credentials=credentials,
            metrics=metrics, data_space=data_space,
            tenant_storage=tenant_storage, queue=queue,
            sessions=backend, model_proxy=local.model_proxy if local else None,
            pool_stats=local.pool.board.read if local else (lambda: EMPTY_POOL_STATS),
            isolation=local.launcher.isolation if local else None, local=local, webhooks=webhooks,
            internal_secret=internal_secret, coordinator_id=server_id,
        )
        self.components = components
        self.app = build_app(components)
        self.app.on_shutdown.append(self._on_shutdown)
        log.info("ashd components started", extra={
            "version": __version__, "python": f"{platform.python_version()} ({sys.executable})", "mode": settings.mode,
            "database": Database.describe(settings.effective_database_url), "dataDir": str(data),
        })
        return components

    async def _start_local_runner(self, db: Database, local: LocalSessions, secret: str) -> None:
        """SERVICE_COORDINATOR_LOCAL: the local pool registered as a runner, so the other coordinators
        route its sessions here (ashd/runner/_local_pool.py)."""
        from ashd.runner import LocalPoolRunner, RunnerIdentity, advertised_host

        settings = self.settings
        identity = RunnerIdentity(local.owner_id, advertised_host(settings), settings.runner_port,
                                  int(local.pool.board.read().get("maxCapacity", 0)))
        pool_runner = LocalPoolRunner(db, local, identity, secret, settings.runner_heartbeat_seconds,
                                      settings.shutdown_grace_seconds, settings.max_body_bytes * 2)
        await pool_runner.start(settings.host)
        self._stops.append(("local pool runner", pool_runner.stop))
        self.local_runner = pool_runner

    async def _on_shutdown(self, _app: web.Application) -> None:
        from ashd import runtime

        if self.components is not None:
            if self.components.queue is not None:
                await self.components.queue.quiesce()  # no new queue turns while the running ones finish
            await runtime.drain(self.components.sessions, self.settings.shutdown_grace_seconds)

    async def serve(self) -> None:
        await self.start_components()
        assert self.app is not None
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None,
                                     shutdown_timeout=self.settings.shutdown_grace_seconds)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        log.info("listening", extra={"host": self.settings.host, "port": self.settings.port,
                                     "eventLoop": running_loop_name()})

    async def stop(self) -> None:
        """HTTP first, then the rest in the reverse order of start."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await unwind(self._stops)
        log.info("ashd stopped")


async def run(settings: Settings) -> None:
    server = Server(settings)

    async def serve() -> None:
        await server.serve()
        settle_heap()  # this process is the server: what its start built lives as long as it does

    await run_until_signalled(serve, server.stop, log, "stop requested; shutting down gracefully")
