"""Actors and sandboxes of a running server: started after storage, stopped before it.

Order: sandbox launcher (isolation probe, cgroups, zygote) → snapshot actor → model proxy →
orphaned sessions paused → session registry → pool actor (which pre-warms). Stop is the reverse.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from ashd.actors._aio import call
from ashd.actors._board import StatsBoard
from ashd.actors._pool import PoolActor, PoolConfig, default_capacity
from ashd.actors._pool_types import SandboxLost
from ashd.actors._session_deps import SessionDeps
from ashd.actors._sessions import SessionRegistry
from ashd.actors._snapshot import SnapshotActor, snapshot_proxy
from ashd.actors._turn import TurnLimits
from ashd.backends import LocalBackend, TurnDriver
from ashd.backends._local import snapshot_reader
from ashd.logs import emit_line
from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits, SandboxSpec
from ashd.sandboxing._model_proxy import ModelProxy
from ashd.services import Services
from ashd.storage._models import iso, utcnow
from ashd.storage._sessions import Sessions
from ashd.storage._snapshots import SnapshotBoard

log = logging.getLogger(__name__)
StopStep = Callable[[], Awaitable[None]]
# Server variables a sandbox may inherit; everything else of the server's environment stays out.
ENV_ALLOWLIST = ("LANG", "LC_ALL", "TZ")


@dataclass
class PoolRef:
    ref: pykka.ActorRef[PoolActor]
    proxy: Any
    board: StatsBoard


def sandbox_env() -> dict[str, str]:
    env = {"LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ})
    return env


async def start(services: Services) -> list[tuple[str, StopStep]]:
    settings = services.settings
    stops: list[tuple[str, StopStep]] = []
    if settings.mode == "coordinator":
        # The runner registry endpoints work, but routing sessions to runners is not built yet:
        # say so instead of silently behaving like standalone.
        log.warning("SERVICE_MODE=coordinator: sessions are not routed to runners yet; they run in this "
                    "server's local sandbox pool (the runner registry endpoints are available)")
    loop = asyncio.get_running_loop()
    limits = SandboxLimits(memory_bytes=settings.sandbox_memory_mb * 1024 * 1024, pids=settings.sandbox_pids,
                           cpu_cores=settings.sandbox_cpu, disk_bytes=settings.sandbox_disk_mb * 1024 * 1024)
    _check_socket_paths(settings.data_path)
    launcher = SandboxLauncher(LauncherConfig(data_dir=settings.data_path, limits=limits,
                                              use_zygote=settings.zygote,
                                              allow_weak_isolation=settings.allow_weak_isolation,
                                              egress=settings.egress_policy(),
                                              preallocate_disk=settings.sandbox_disk_preallocate))
    await asyncio.to_thread(launcher.start)
    stops.append(("sandbox launcher", lambda: asyncio.to_thread(launcher.stop)))
    services.isolation = launcher.isolation
    if settings.sandbox_ptrace_agents:
        log.warning("seccomp: the sandboxes of %d agent(s) may ptrace (SERVICE_SANDBOX_PTRACE_AGENTS)",
                    len(settings.sandbox_ptrace_agents))
    services.extras["launcher"] = launcher

    remote = None
    if settings.snapshot_url:
        from ashd.storage._snapshots_stores import store_from_url

        remote = store_from_url(settings.snapshot_url, settings.snapshots_keep)
    services.snapshot_board = SnapshotBoard()
    snap_ref = SnapshotActor.start(settings.data_path / "snapshots", remote, keep=settings.snapshots_keep,
                                   max_bytes=settings.snapshot_max_mb * 1024 * 1024,
                                   board=services.snapshot_board)
    snapshots = snapshot_proxy(snap_ref)
    services.snapshots = snapshots

    async def stop_snapshots() -> None:
        await asyncio.to_thread(lambda: snap_ref.stop(block=True, timeout=settings.actor_timeout_seconds))

    stops.append(("snapshot actor", stop_snapshots))

    model_proxy = _model_proxy(services)
    stops.append(("model proxy", model_proxy.close))

    sessions = Sessions(services.db)
    orphans = await sessions.pause_orphans()
    if orphans:
        log.info("paused sessions left active by the previous process", extra={"count": len(orphans)})
    await _rescue_workspaces(sessions, snapshots, launcher, settings.actor_timeout_seconds)

    from ashd.storage._agents import resolve_agent
    from ashd.storage._credentials import use_credential
    from ashd.storage._usage import record_usage

    def decrypt_env(blob: bytes | None, session_id: str) -> dict[str, str]:
        value = services.cipher.decrypt_json(blob, session_id.encode()) if blob else None
        return dict(value) if isinstance(value, dict) else {}

    def count_resume(path: str, session_id: str, agent_name: str) -> None:
        services.metrics.count_resume(path)
        emit_line({"type": "resume_hit", "path": path, "sessionId": session_id, "agentName": agent_name,
                   "ts": iso(utcnow())})

    async def usage(tenant: str, session_id: str, agent_name: str, values: dict[str, float]) -> None:
        await record_usage(services.db, tenant, session_id, agent_name, values)

    pool_holder: dict[str, Any] = {}
    registry_holder: dict[str, SessionRegistry] = {}

    def on_lost(lost: SandboxLost) -> None:
        registry = registry_holder.get("r")
        if registry is not None:
            loop.call_soon_threadsafe(registry.on_sandbox_lost, lost)

    def spec_for(sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id=sandbox_id, paths=launcher.paths_for(sandbox_id), env=sandbox_env(),
                           limits=limits, network=network)

    def snapshot_now(session_id: str, workspace: Path) -> None:
        snapshots.snapshot(session_id, workspace).get(timeout=settings.actor_timeout_seconds)

    capacity = settings.max_sandboxes or default_capacity(limits.memory_bytes)
    from ashd.actors._warmer import Warmer

    warmer = Warmer(loop, model_proxy, settings.actor_timeout_seconds)
    stops.append(("warmer", warmer.close))
    pool_ref = PoolActor.start(
        PoolConfig(max_capacity=capacity, prewarm=min(settings.prewarm, capacity),
                   idle_timeout=float(settings.idle_timeout_seconds),
                   shutdown_grace=min(2.0, settings.shutdown_grace_seconds)),
        launcher, spec_for, snapshot_now, on_lost, warmer,
    )
    pool_proxy = pool_ref.proxy()
    board = await call(pool_proxy.board, settings.actor_timeout_seconds)
    pool_holder["p"] = pool_proxy
    services.pool = PoolRef(pool_ref, pool_proxy, board)

    deps = SessionDeps(
        loop=loop,
        sessions=sessions,
        pool=pool_proxy,
        snapshots=snapshots,
        model_proxy=model_proxy,
        resolve_agent=lambda tenant, name: resolve_agent(services, tenant, name),
        resolve_credential=lambda tenant, cid: use_credential(services, tenant, cid),
        decrypt_env=decrypt_env,
        count_resume=count_resume,
        record_usage=usage,
        fallback_api_key=settings.anthropic_api_key,
        ask_timeout=settings.actor_timeout_seconds,
        setup_timeout=float(settings.setup_timeout_seconds),
        shutdown_grace=min(2.0, settings.shutdown_grace_seconds),
        network_default=settings.sandbox_network,
        sandbox_owner=lambda _sid: _sandbox_owner(),
        warmer=warmer,
        seccomp_profile=settings.seccomp_profile,
    )
    registry = SessionRegistry(deps)
    registry_holder["r"] = registry
    services.sessions = registry
    services.model_proxy = model_proxy

    async def exit_info(sandbox_id: str) -> Any:
        return await call(pool_proxy.exit_info(sandbox_id), settings.actor_timeout_seconds)

    driver = TurnDriver(sessions, TurnLimits(settings.turn_max_stored_mb * 1024 * 1024, settings.turn_max_events,
                                             settings.storage_retry_seconds),
                        services.metrics, model_proxy, usage, exit_info, settings.debug_timing)
    backend = LocalBackend(registry, driver, snapshot_reader(snapshots, settings.actor_timeout_seconds))
    services.backend = backend
    stops.append(("session actors", backend.close))

    async def stop_pool() -> None:
        await asyncio.to_thread(lambda: pool_ref.stop(block=True, timeout=settings.actor_timeout_seconds))

    # Registered last so it stops first: sandboxes go before the launcher and the snapshot actor.
    stops.append(("pool actor", stop_pool))
    return stops


def _model_proxy(services: Services) -> ModelProxy:
    """The proxy meters into the configured database, like every other usage record."""
    from ashd.sandboxing._model_policy import ModelPolicy
    from ashd.storage._model_calls import session_spend, store_model_calls, tenant_spend

    db, settings = services.db, services.settings
    return ModelProxy(settings.anthropic_base_url or "https://api.anthropic.com",
                      default_key=lambda: settings.anthropic_api_key,
                      policy=ModelPolicy.from_settings(settings),
                      store=lambda records: store_model_calls(db, records),
                      session_spend=lambda sid: session_spend(db, sid),
                      tenant_spend=lambda tenant, since: tenant_spend(db, tenant, since),
                      metrics=services.metrics, server_id=services.coordinator_id)


async def _rescue_workspaces(sessions: Sessions, snapshots: Any, launcher: SandboxLauncher,
                             timeout: float) -> None:
    """Sandboxes never outlive the server, but a killed server leaves their directories behind.

    The workspace of a session's last sandbox holds its newest files (newer than any snapshot:
    snapshots are taken from it), so it becomes the session's newest snapshot, which the files
    API serves and a cold resume restores. Then the directory goes. A disk image that is no longer
    mounted (a reboot) is mounted again to read it.
    """
    dirs = [d for d in launcher.sandboxes_dir.glob("sb-*") if d.is_dir()]
    if not dirs:
        return
    owners = await sessions.owners_of_sandboxes([d.name for d in dirs])
    for d in dirs:
        session_id = owners.get(d.name)
        workspace = await asyncio.to_thread(launcher.mount_leftover, d.name) if session_id is not None else None
        if session_id is not None and workspace is not None:
            try:
                await asyncio.to_thread(_snapshot_sync, snapshots, session_id, workspace, timeout * 4)
            except Exception:
                log.exception("could not snapshot a leftover workspace; keeping it",
                              extra={"sessionId": session_id, "sandboxId": d.name})
                continue
            log.info("snapshotted the workspace of a sandbox left by the previous process",
                     extra={"sessionId": session_id, "sandboxId": d.name})
        await asyncio.to_thread(launcher.destroy_dirs, d.name)


def _snapshot_sync(snapshots: Any, session_id: str, workspace: Path, timeout: float) -> None:
    snapshots.snapshot(session_id, workspace).get(timeout=timeout)


# sun_path is 108 bytes on Linux; the deepest socket is <data>/sandboxes/<id>/disk/run/bridge.sock.
_SOCKET_PATH_MAX = 107
_SANDBOX_ID_LEN = len("sb-") + 16


def _check_socket_paths(data: Path) -> None:
    deepest = len(str(data / "sandboxes")) + 1 + _SANDBOX_ID_LEN + len("/disk/run/bridge.sock")
    if deepest > _SOCKET_PATH_MAX:
        from ashd.errors import ConfigError

        raise ConfigError(
            f"SERVICE_DATA_DIR={data} is too long: sandbox sockets under it would exceed the "
            f"{_SOCKET_PATH_MAX}-byte Unix socket path limit; use a path of at most "
            f"{_SOCKET_PATH_MAX - (deepest - len(str(data)))} characters"
        )


def _sandbox_owner() -> tuple[int, int] | None:
    from ashd.sandboxing import _layout

    return (_layout.SANDBOX_UID, _layout.SANDBOX_GID)


async def drain(services: Services) -> None:
    """Graceful shutdown: running turns get `shutdown_grace_seconds` to finish and be stored."""
    backend = services.backend
    if backend is None:
        return
    deadline = asyncio.get_running_loop().time() + services.settings.shutdown_grace_seconds
    while asyncio.get_running_loop().time() < deadline:
        if await backend.running_turns() == 0:
            return
        await asyncio.sleep(0.1)
