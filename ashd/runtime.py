"""Actors and sandboxes of a running server: started after storage, stopped before it.

Order (`start`, top to bottom): sandbox launcher (isolation probe, cgroups, zygote) → snapshot
actor → model proxy → webhook dispatcher (before anything can emit an event) → orphaned sessions
paused, leftover workspaces rescued → warmer → pool actor (which pre-warms) → session registry and
its backend; then (`start_queue`, after the backend it runs turns on) the queue actor. Stop is the
reverse, except that the pool stops first: sandboxes go before the launcher and the snapshot actor
they use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from ashd._bootstrap import sandbox_owner_id
from ashd._signals import StopStep
from ashd.actors import (
    Activity,
    DispatchConfig,
    LivenessConfig,
    LogTails,
    OwedSnapshots,
    PoolActor,
    PoolConfig,
    QueueConfig,
    QueueService,
    RunnerLiveness,
    RunnerRegistryActor,
    SandboxLost,
    SessionDeps,
    SessionRegistry,
    SnapshotActor,
    StatsBoard,
    TurnLimits,
    Warmer,
    WebhookDispatcher,
    call,
    count_pool_resume,
    default_capacity,
    snapshot_proxy,
    stop_actor,
    tell_loop,
)
from ashd.backends import (
    BundleConfig,
    LocalBackend,
    RoutingBackend,
    RunnerClient,
    SessionBackend,
    TurnDriver,
    latest_snapshot,
    snapshot_reader,
)
from ashd.config import Settings
from ashd.errors import SandboxError
from ashd.logs import emit_line
from ashd.metrics import Metrics
from ashd.sandboxing import (
    LEFTOVER_DETACH_SECONDS,
    SANDBOX_GID,
    SANDBOX_UID,
    LauncherConfig,
    ModelProxy,
    SandboxLauncher,
    SandboxLimits,
    SandboxSpec,
    UpstreamRoute,
    WebhookTargets,
    upstream_route,
)
from ashd.storage import (
    Agents,
    Cipher,
    Credentials,
    Database,
    Runners,
    SessionLogs,
    Sessions,
    SnapshotBoard,
    SnapshotTooLarge,
    WalCheckpointer,
    Webhooks,
    iso,
    utcnow,
)

if TYPE_CHECKING:
    from ashd.storage import TenantStorage

log = logging.getLogger(__name__)
# Server variables a sandbox may inherit; everything else of the server's environment stays out.
ENV_ALLOWLIST = ("LANG", "LC_ALL", "TZ")
STATUS_CHANGED = "session.status_changed"


@dataclass
class PoolRef:
    ref: pykka.ActorRef[PoolActor]
    proxy: Any
    board: StatsBoard


@dataclass(frozen=True)
class StorageParts:
    """What the actors need of the storage layer, opened before them."""

    settings: Settings
    db: Database
    cipher: Cipher
    agents: Agents
    credentials: Credentials
    metrics: Metrics
    server_id: str  # this process: the model proxy's records name it


@dataclass(frozen=True)
class LocalSessions:
    """This process's sandboxes and actors, as `start` built them."""

    launcher: SandboxLauncher
    snapshots: Any  # SnapshotActor proxy
    snapshot_board: SnapshotBoard
    model_proxy: ModelProxy
    pool: PoolRef
    registry: SessionRegistry
    backend: LocalBackend
    owner_id: str = ""  # stamped on the sessions whose sandboxes these are (`sandbox_owner_id`)
    webhooks: WebhookDispatcher | None = None
    # The requests in flight on the front ends that reach these sessions (counted by their
    # middleware): the pool starts its spares in the quiet moments between them.
    activity: Activity = field(default_factory=Activity)


class _LostSandboxes:
    """The pool reports a lost sandbox to the session registry, which is built after it (the
    registry's actors need the pool): the registry is attached once it exists."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.registry: SessionRegistry | None = None

    def __call__(self, lost: SandboxLost) -> None:  # on the pool actor's thread
        if self.registry is not None:
            tell_loop(self._loop, self.registry.on_sandbox_lost, lost)


def sandbox_env() -> dict[str, str]:
    env = {"LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ})
    return env


def sandbox_limits(settings: Settings) -> SandboxLimits:
    return SandboxLimits(memory_bytes=settings.sandbox_memory_mb * 1024 * 1024, pids=settings.sandbox_pids,
                         cpu_cores=settings.sandbox_cpu, disk_bytes=settings.sandbox_disk_mb * 1024 * 1024)


async def start(parts: StorageParts, stops: list[tuple[str, StopStep]], *,
                runner_id: str | None = None) -> LocalSessions:
    """Start everything in order; each started piece registers its stop in `stops` at once, so a
    failing step leaves the caller able to stop what came before it. `runner_id`: this process is
    that runner (`ashd runner`): its sessions carry the id, and its start-up pauses only its own."""
    settings = parts.settings
    model_route = upstream_route(_model_api(settings), os.environ)  # a bad proxy stops the start here
    launcher = await _start_launcher(settings, stops)
    board = SnapshotBoard()
    # The front end's requests in flight: what can wait, waits for a quiet moment, which the loop says.
    activity = Activity(loop=asyncio.get_running_loop())
    if parts.db.sqlite_file is not None:  # SQLite's checkpoints in quiet moments, not in a request's commit
        checkpoints = WalCheckpointer(parts.db.sqlite_file, activity.quiet)
        checkpoints.start()
        stops.append(("WAL checkpoints", lambda: asyncio.to_thread(checkpoints.close)))
    owed = OwedSnapshots(activity)  # snapshots that wait for a quiet moment (a pause's, a DELETE's final one)
    snapshots = _start_snapshots(settings, board, owed, stops)
    model_proxy = _model_proxy(parts, model_route)
    stops.append(("model proxy", model_proxy.close))
    webhooks = start_webhooks(parts, stops)
    # A runner owns its sessions by its runner id (which may be derived, not set), as the coordinator routes.
    owner_id = runner_id or sandbox_owner_id(settings)
    sessions = Sessions(parts.db, owner_id)

    async def orphan_paused(tenant: str, session_id: str, agent: str, before: str) -> None:
        await webhooks.emit(tenant, STATUS_CHANGED,
                            status_event(session_id, agent, before, "paused", "paused", {"reason": "restart"}))

    # Only what this process owned: another server or runner on the same database keeps its live
    # sessions. Rows from before owners were stamped count as ours only on a one-process SQLite.
    unowned = (settings.mode == "standalone" and runner_id is None and not settings.runner_id
               and parts.db.dialect == "sqlite")
    orphans = await sessions.pause_orphans(owner_id=owner_id, unowned=unowned, on_paused=orphan_paused)
    if orphans:
        log.info("paused sessions left active by the previous process",
                 extra={"count": len(orphans), "ownerId": owner_id})
    await _rescue_workspaces(sessions, snapshots, launcher, settings.actor_timeout_seconds)
    warmer = Warmer(asyncio.get_running_loop(), model_proxy, settings.actor_timeout_seconds)
    stops.append(("warmer", warmer.close))
    # What sandboxes print, kept per session (GET .../logs); stopped after the pool (registered before
    # it), so the last lines of the sandboxes it stops are stored.
    tails = LogTails(SessionLogs(parts.db, settings.session_log_lines))
    stops.append(("session logs", tails.close))
    lost = _LostSandboxes(asyncio.get_running_loop())
    pool = await _start_pool(settings, launcher, snapshots, lost, warmer, activity)
    registry = SessionRegistry(_session_deps(parts, sessions, pool.proxy, snapshots, model_proxy, warmer, webhooks,
                                            tails, runner_id, pool.board, owed))
    lost.registry = registry
    bundles = BundleConfig(Path(settings.data_dir), settings.snapshot_max_mb * 1024 * 1024,
                           latest_snapshot(snapshots, settings.actor_timeout_seconds))
    backend = LocalBackend(registry, _turn_driver(parts, sessions, pool.proxy, model_proxy, webhooks),
                           snapshot_reader(snapshots, settings.actor_timeout_seconds), bundles)
    stops.append(("session actors", backend.close))

    # Registered last so it stops first: sandboxes go before the launcher and the snapshot actor.
    stops.append(("pool actor", lambda: stop_actor(pool.ref, settings.actor_timeout_seconds)))
    # ... but the snapshots still owed (a pause's, a DELETE's final one) are taken before the
    # sandboxes that hold their workspaces go.
    stops.append(("owed snapshots", lambda: call(snapshots.take_owed(), settings.actor_timeout_seconds * 4)))
    return LocalSessions(launcher, snapshots, board, model_proxy, pool, registry, backend, owner_id, webhooks,
                         activity)


def start_runner_liveness(settings: Settings, db: Database, metrics: Metrics,
                          stops: list[tuple[str, StopStep]]) -> RunnerLiveness | None:
    """On a coordinator: the sweep that marks silent runners dead and pauses their sessions."""
    if settings.mode != "coordinator":
        return None
    liveness = RunnerLiveness(Runners(db), LivenessConfig(settings.runner_liveness_seconds,
                                                          settings.runner_sweep_seconds,
                                                          settings.runner_sweep_jitter_seconds), metrics)
    liveness.start()
    stops.append(("runner liveness", liveness.close))
    return liveness

def start_webhooks(parts: StorageParts, stops: list[tuple[str, StopStep]]) -> WebhookDispatcher:
    """The webhook outbox's sender; started before anything can emit an event, stopped after."""
    settings = parts.settings
    dispatcher = WebhookDispatcher(
        Webhooks(parts.db, parts.cipher), WebhookTargets.parse(settings.sandbox_egress_allow, settings.webhook_allow),
        DispatchConfig(concurrency=settings.webhook_concurrency, timeout_seconds=settings.webhook_timeout_seconds,
                       max_attempts=settings.webhook_max_attempts, backoff_seconds=settings.webhook_backoff_seconds))
    dispatcher.start()
    stops.append(("webhook dispatcher", dispatcher.close))
    return dispatcher


def status_event(session_id: str, agent: str, before: str | None, after: str, action: str,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """The `session.status_changed` webhook's data."""
    reason = extra.get("reason")
    return {"sessionId": session_id, "agentName": agent, "from": before, "to": after, "action": action,
            "reason": reason if isinstance(reason, str) else action}


def start_queue(parts: StorageParts, backend: SessionBackend, tenant_storage: TenantStorage,
                stops: list[tuple[str, StopStep]], webhooks: WebhookDispatcher | None = None) -> QueueService:
    """The queue actor, after the session backend it runs turns on; registered after it, so it stops
    (hands its unfinished items back) before the session actors go. `tenant_storage`: the limits
    POST /api/sessions applies, applied to the sessions the queue creates."""
    from ashd.backends import QueueTurns
    from ashd.storage import Backoff, QueueItems

    settings = parts.settings
    items = QueueItems(parts.db)
    turns = QueueTurns(backend, items, parts.agents, tenant_storage, parts.server_id,
                       Backoff(settings.queue_retry_seconds, settings.queue_retry_max_seconds),
                       settings.sandbox_disk_max_mb, parts.metrics,
                       on_finished=webhooks.queue_item_finished if webhooks is not None else None)
    service = QueueService(items, turns.run, QueueConfig(
        owner=parts.server_id, capacity=settings.queue_concurrency,
        per_tenant=settings.queue_concurrency_per_tenant, lease_s=settings.queue_lease_seconds,
        timeout=settings.actor_timeout_seconds))
    stops.append(("queue", lambda: service.close(min(2.0, settings.shutdown_grace_seconds))))
    return service


async def _start_launcher(settings: Settings, stops: list[tuple[str, StopStep]]) -> SandboxLauncher:
    _check_socket_paths(settings.data_path)
    launcher = SandboxLauncher(LauncherConfig(data_dir=settings.data_path, limits=sandbox_limits(settings),
                                              use_zygote=settings.zygote,
                                              allow_weak_isolation=settings.allow_weak_isolation,
                                              egress=settings.egress_policy(),
                                              preallocate_disk=settings.sandbox_disk_preallocate))
    await asyncio.to_thread(launcher.start)
    stops.append(("sandbox launcher", lambda: asyncio.to_thread(launcher.stop)))
    if settings.sandbox_ptrace_agents:
        log.warning("seccomp: the sandboxes of %d agent(s) may ptrace (SERVICE_SANDBOX_PTRACE_AGENTS)",
                    len(settings.sandbox_ptrace_agents))
    return launcher


def _start_snapshots(settings: Settings, board: SnapshotBoard, owed: OwedSnapshots,
                     stops: list[tuple[str, StopStep]]) -> Any:
    remote = None
    if settings.snapshot_url:
        from ashd.storage import store_from_url

        remote = store_from_url(settings.snapshot_url, settings.snapshots_keep)
    ref = SnapshotActor.start(settings.data_path / "snapshots", remote, keep=settings.snapshots_keep,
                              max_bytes=settings.snapshot_max_mb * 1024 * 1024, board=board, owed=owed)

    stops.append(("snapshot actor", lambda: stop_actor(ref, settings.actor_timeout_seconds)))
    return snapshot_proxy(ref)


async def _start_pool(settings: Settings, launcher: SandboxLauncher, snapshots: Any,
                      on_lost: Callable[[SandboxLost], None], warmer: Warmer, activity: Activity) -> PoolRef:
    limits = sandbox_limits(settings)

    def spec_for(sandbox_id: str, network: bool) -> SandboxSpec:
        return SandboxSpec(sandbox_id=sandbox_id, paths=launcher.paths_for(sandbox_id), env=sandbox_env(),
                           limits=limits, network=network)

    def snapshot_now(session_id: str, workspace: Path) -> None:  # on the pool actor's thread
        snapshots.snapshot(session_id, workspace).get(timeout=settings.actor_timeout_seconds)

    capacity = settings.max_sandboxes or default_capacity(limits.memory_bytes)
    ref = PoolActor.start(
        PoolConfig(max_capacity=capacity, prewarm=min(settings.prewarm, capacity),
                   idle_timeout=float(settings.idle_timeout_seconds),
                   shutdown_grace=min(2.0, settings.shutdown_grace_seconds)),
        launcher, spec_for, snapshot_now, on_lost, warmer, activity,
    )
    proxy = ref.proxy()
    return PoolRef(ref, proxy, await call(proxy.board, settings.actor_timeout_seconds))


def _session_deps(parts: StorageParts, sessions: Sessions, pool: Any, snapshots: Any, model_proxy: ModelProxy,
                  warmer: Warmer, webhooks: WebhookDispatcher, tails: LogTails | None = None,
                  runner_id: str | None = None, pool_board: StatsBoard | None = None,
                  owed: OwedSnapshots | None = None) -> SessionDeps:
    settings = parts.settings
    loop = asyncio.get_running_loop()

    def on_status(tenant: str, session_id: str, agent: str, before: str | None, after: str, action: str,
                  extra: dict[str, Any]) -> None:  # on an actor's thread: hand over, never wait
        if webhooks.store.known_unheard(tenant, STATUS_CHANGED):
            return  # no hook listens: no wake-up of the loop beside the transition's answer
        loop.call_soon_threadsafe(webhooks.emit_soon, tenant, STATUS_CHANGED,
                                  status_event(session_id, agent, before, after, action, extra), utcnow())

    def decrypt_env(blob: bytes | None, session_id: str) -> dict[str, str]:
        value = parts.cipher.decrypt_json(blob, session_id.encode()) if blob else None
        return dict(value) if isinstance(value, dict) else {}

    def count_resume(path: str, session_id: str, agent_name: str) -> None:
        if pool_board is not None:
            count_pool_resume(pool_board, path)
        parts.metrics.count_resume(path)
        emit_line({"type": "resume_hit", "path": path, "sessionId": session_id, "agentName": agent_name,
                   "ts": iso(utcnow())})

    return SessionDeps(
        loop=asyncio.get_running_loop(),
        sessions=sessions,
        pool=pool,
        snapshots=snapshots,
        model_proxy=model_proxy,
        resolve_agent=parts.agents.resolve,
        resolve_credential=parts.credentials.use,
        decrypt_env=decrypt_env,
        count_resume=count_resume,
        fallback_api_key=settings.anthropic_api_key,
        ask_timeout=settings.actor_timeout_seconds,
        setup_timeout=float(settings.setup_timeout_seconds),
        shutdown_grace=min(2.0, settings.shutdown_grace_seconds),
        network_default=settings.sandbox_network,
        sandbox_owner=lambda _sid: (SANDBOX_UID, SANDBOX_GID),
        warmer=warmer,
        seccomp_profile=settings.seccomp_profile,
        context_window=settings.model_context_window,
        engine=settings.engine,
        session_logs=tails,
        setup_log_lines=settings.setup_log_lines,
        snapshot_max_bytes=settings.snapshot_max_mb * 1024 * 1024 if settings.snapshot_max_mb else None,
        runner_id=runner_id,
        on_status=on_status,
        owe_snapshot=owed.add if owed is not None else None,
    )


def _turn_driver(parts: StorageParts, sessions: Sessions, pool: Any, model_proxy: ModelProxy,
                 webhooks: WebhookDispatcher) -> TurnDriver:
    settings = parts.settings

    async def exit_info(sandbox_id: str) -> Any:
        return await call(pool.exit_info(sandbox_id), settings.actor_timeout_seconds)

    limits = TurnLimits(settings.turn_max_stored_mb * 1024 * 1024, settings.turn_max_events,
                        settings.storage_retry_seconds)
    def completed(tenant: str, data: Callable[[], dict[str, Any]]) -> None:
        if not webhooks.store.known_unheard(tenant, "turn.completed"):  # nothing made for a tenant with no hook
            webhooks.emit_soon(tenant, "turn.completed", data())

    return TurnDriver(sessions, limits, parts.metrics, model_proxy, exit_info, settings.debug_timing,
                      on_completed=completed)


def _model_api(settings: Settings) -> str:
    return settings.anthropic_base_url or "https://api.anthropic.com"


def _model_proxy(parts: StorageParts, route: UpstreamRoute) -> ModelProxy:
    """The proxy meters into the configured database, like every other usage record."""
    from ashd.sandboxing import ModelPolicy
    from ashd.storage import session_spend, store_model_calls, tenant_spend

    db, settings = parts.db, parts.settings
    log.info("model API %s reached %s", _model_api(settings), route.describe())
    return ModelProxy(_model_api(settings), route=route,
                      default_key=lambda: settings.anthropic_api_key,
                      policy=ModelPolicy.from_settings(settings),
                      store=lambda records: store_model_calls(db, records),
                      session_spend=lambda sid: session_spend(db, sid),
                      tenant_spend=lambda tenant, since: tenant_spend(db, tenant, since),
                      metrics=parts.metrics, server_id=parts.server_id)


async def _rescue_workspaces(sessions: Sessions, snapshots: Any, launcher: SandboxLauncher,
                             timeout: float) -> None:
    """Sandboxes never outlive the server, but a killed server leaves their directories behind.

    The workspace of a session's last sandbox holds its newest files (newer than any snapshot:
    snapshots are taken from it), so it becomes the session's newest snapshot, which the files
    API serves and a cold resume restores. Then the directory goes. A disk image that is no longer
    mounted (a reboot) is mounted again to read it. One that cannot be read now is kept, never
    removed: every later start tries again.
    """
    dirs = [d for d in launcher.sandboxes_dir.glob("sb-*") if d.is_dir()]
    if not dirs:
        return
    # Ended sessions too: a DELETE's final snapshot is taken after its answer, and a kill in between
    # leaves the workspace here with nothing newer stored.
    owners = await sessions.owners_of_sandboxes([d.name for d in dirs], ended=True)
    # One wait for all the images still attached: the killed server's sandboxes die together, so
    # their filesystems let go together, and a stuck one must not hold the start for each of them.
    deadline = time.monotonic() + LEFTOVER_DETACH_SECONDS
    for d in dirs:
        session_id = owners.get(d.name)
        workspace = None
        if session_id is not None:
            try:
                workspace = await asyncio.to_thread(launcher.mount_leftover, d.name,
                                                    max(0.0, deadline - time.monotonic()))
            except SandboxError as exc:
                # Its newest files may be in there: a failure to read them now never deletes them.
                log.warning("could not read the workspace of a sandbox left by the previous process; keeping "
                            "it for the next start: %s", exc.message,
                            extra={"sessionId": session_id, "sandboxId": d.name})
                continue
        if session_id is not None and workspace is not None:
            try:
                await call(snapshots.snapshot(session_id, workspace), timeout * 4)
            except SnapshotTooLarge as exc:  # kept, it would be refused again at every start
                log.warning("the workspace of a sandbox left by the previous process is over the snapshot limit; "
                            "removing it (the previous snapshot stays): %s", exc.message,
                            extra={"sessionId": session_id, "sandboxId": d.name})
            except Exception:
                log.exception("could not snapshot a leftover workspace; keeping it",
                              extra={"sessionId": session_id, "sandboxId": d.name})
                continue
            log.info("snapshotted the workspace of a sandbox left by the previous process",
                     extra={"sessionId": session_id, "sandboxId": d.name})
        await asyncio.to_thread(launcher.destroy_dirs, d.name)


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


@dataclass(frozen=True)
class Coordinator:
    """A coordinator's routing (SERVICE_MODE=coordinator): its backend, and its local pool if any."""

    backend: RoutingBackend
    local: LocalSessions | None


async def start_coordinator(parts: StorageParts, stops: list[tuple[str, StopStep]]) -> Coordinator:
    """The runner registry and the routing backend; the local pool only with SERVICE_COORDINATOR_LOCAL
    (then sessions without an alive runner run here)."""
    settings = parts.settings
    # The local pool is a runner like the others (its runner API on SERVICE_RUNNER_PORT, its row in
    # the runners table, see `ashd.runner.LocalPoolRunner`): its sessions carry its id, so every
    # coordinator routes to them and a dead coordinator's sessions follow a dead runner's rules.
    local_id = sandbox_owner_id(settings) if settings.coordinator_local else None
    local = await start(parts, stops, runner_id=local_id) if local_id is not None else None
    ref = RunnerRegistryActor.start(asyncio.get_running_loop(), Runners(parts.db).list,
                                    settings.runner_liveness_seconds, timeout=settings.actor_timeout_seconds)
    stops.append(("runner registry", lambda: stop_actor(ref, settings.actor_timeout_seconds)))
    assert settings.internal_secret, "load_settings requires SERVICE_INTERNAL_SECRET in coordinator mode"
    client = RunnerClient(settings.internal_secret,
                          settings.actor_timeout_seconds + 2 * settings.setup_timeout_seconds + 30, settings.data_path)
    backend = RoutingBackend(Sessions(parts.db), ref.proxy(), client, local.backend if local else None,
                             settings.actor_timeout_seconds, local_runner_id=local_id)
    stops.append(("runner connections", backend.close))
    return Coordinator(backend, local)


async def drain(backend: SessionBackend, grace_seconds: float) -> None:
    """Graceful shutdown: running turns get `grace_seconds` to finish and be stored."""
    deadline = asyncio.get_running_loop().time() + grace_seconds
    while asyncio.get_running_loop().time() < deadline:
        if await backend.running_turns() == 0:
            return
        await asyncio.sleep(0.1)
