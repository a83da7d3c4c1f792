"""Builds and runs the process: storage → actors → HTTP, and the reverse on stop.

Each step that starts something registers its stop; `stop()` runs them in reverse order and keeps
going past a failing step, so one broken component never leaves the others running.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress

from aiohttp import web

from ashd import __version__
from ashd._bootstrap import ensure_api_keys, ensure_internal_secret, prepare_data_dir
from ashd.components import Components, coordinator_id
from ashd.config import Settings
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
    TenantStorage,
    load_or_create_key,
)

log = logging.getLogger(__name__)
StopStep = Callable[[], Awaitable[None]]


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.components: Components | None = None
        self.app: web.Application | None = None
        self._stops: list[tuple[str, StopStep]] = []
        self._runner: web.AppRunner | None = None

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
                        settings.agent_max_upload_mb * MIB)
        credentials = Credentials(db, cipher)
        data_space = DataDirSpace(data, settings.data_dir_min_free_mb * MIB, settings.data_dir_warn_free_mb * MIB)
        metrics = Metrics()
        server_id = coordinator_id()
        for warning in await configuration_warnings(settings, keys):
            log.warning(warning)
        # Actors and sandboxes; imported late to keep the CLI light.
        from ashd import runtime

        local = await runtime.start(runtime.StorageParts(settings, db, cipher, agents, credentials, metrics,
                                                         server_id), self._stops)
        # HTTP.
        components = Components(
            settings=settings, db=db, api_keys=keys, cipher=cipher, agents=agents, credentials=credentials,
            metrics=metrics, data_space=data_space,
            tenant_storage=TenantStorage(db, local.snapshot_board, settings),
            sessions=local.backend, model_proxy=local.model_proxy, pool_stats=local.pool.board.read,
            isolation=local.launcher.isolation, local=local,
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

    async def _on_shutdown(self, _app: web.Application) -> None:
        from ashd import runtime

        if self.components is not None:
            await runtime.drain(self.components.sessions, self.settings.shutdown_grace_seconds)

    async def serve(self) -> None:
        await self.start_components()
        assert self.app is not None
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None,
                                     shutdown_timeout=self.settings.shutdown_grace_seconds)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        await site.start()
        log.info("listening", extra={"host": self.settings.host, "port": self.settings.port})

    async def stop(self) -> None:
        """HTTP first, then the rest in the reverse order of start."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        while self._stops:
            name, step = self._stops.pop()
            try:
                await step()
            except Exception:
                log.exception("stopping %s failed", name)
        log.info("ashd stopped")


async def run(settings: Settings) -> None:
    server = Server(settings)
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    try:
        await server.serve()
        await stop_event.wait()
        log.info("stop requested; shutting down gracefully")
    finally:
        with suppress(Exception):
            await server.stop()
