"""What a SessionActor needs from the rest of the server, and the immutable values it exchanges."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ashd.storage import Sessions


@dataclass(frozen=True)
class SessionDeps:
    loop: asyncio.AbstractEventLoop  # where the session's database and bridge work runs (`_staged.py`)
    sessions: Sessions
    pool: Any  # PoolActor proxy
    snapshots: Any  # SnapshotActor proxy or None
    model_proxy: Any  # ModelProxy or None
    resolve_agent: Callable[[str, str], Coroutine[Any, Any, Any]]  # (tenant, name) -> AgentView
    resolve_credential: Callable[[str, str], Coroutine[Any, Any, Any]]  # (tenant, id) -> ResolvedCredential
    decrypt_env: Callable[[bytes | None, str], dict[str, str]]
    count_resume: Callable[[str, str, str], None]  # (path, session id, agent name)
    fallback_api_key: str | None
    ask_timeout: float
    setup_timeout: float
    shutdown_grace: float
    network_default: bool
    sandbox_owner: Callable[[str], tuple[int, int] | None]
    warmer: Any = None  # Warmer: connections made while a sandbox waited in the pool
    # (tenant, agent name) -> seccomp profile; the operator's SERVICE_SANDBOX_PTRACE_AGENTS.
    seccomp_profile: Callable[[str, str], str] = lambda _tenant, _agent: "default"
    # The engine's window for unknown models (SERVICE_MODEL_CONTEXT_WINDOW), passed at init.
    context_window: int = 200_000
    engine: str = "builtin"  # SERVICE_ENGINE: agents whose settings.json names none
    session_logs: Any = None  # LogTails: setup output and sandbox stderr, stored (None: not kept)
    setup_log_lines: int = 1000  # SERVICE_SETUP_LOG_LINES
    # Runner mode: this runner's id, stamped on the sessions it creates or resumes (the coordinator
    # routes every later call for a session by it). None in standalone mode.
    runner_id: str | None = None
    # Told (on the actor's thread, must not block) when a session's status changed:
    # (tenant, session id, agent name, from, to, action, extra). The webhooks' session.status_changed.
    on_status: Callable[[str, str, str, str | None, str, str, dict[str, Any]], None] | None = None
    # SERVICE_SNAPSHOT_MAX_MB in bytes: a DELETE says in its `ended` event that the final snapshot
    # is over it before that snapshot is taken (after the answer).
    snapshot_max_bytes: int | None = None
    # Owe a snapshot to the snapshot actor without a message to it (`OwedSnapshots.add`); None: ask
    # it through `snapshots.snapshot_soon`.
    owe_snapshot: Callable[[str, Path, concurrent.futures.Future[Any] | None], None] | None = None

    @property
    def init_timeout(self) -> float:
        """How long a bridge's init may take: its setup.sh (cut off by the bridge itself after
        `setup_timeout`, with the setup error) and then the engine's start, given as long again.
        A request that starts a sandbox waits for this on top of its own `ask_timeout`."""
        return 2 * self.setup_timeout


@dataclass(frozen=True)
class CreateRequest:
    session_id: str
    tenant: str
    agent_name: str
    model: str | None
    config: dict[str, Any] = field(default_factory=dict)
    credential_id: str | None = None
    agent: Any = None  # the AgentView resolved when the request was checked; resolved again if None


@dataclass(frozen=True)
class SentQuery:
    """A turn's query sent before its prompt was stored (`SendQuery`)."""

    # Should the prompt's write fail: refuses the turn's model calls at once, and its coroutine tells
    # the bridge to drop the query.
    withdraw: Callable[[], Coroutine[Any, Any, None]]
    # Where the query was sent `held`: the prompt is stored, the model proxy may forward its calls.
    admit: Callable[[], None]


# Sends a turn's query to the bridge at once, before its prompt is stored, on the loop's thread
# (`SessionActor.begin_turn`): the bridge works on it while the prompt's write commits. Inside that
# write's own transaction on SQLite, where nothing else runs on the loop until it commits, the model
# proxy admits the turn's calls at once; with `held` (True: the write is awaited, on PostgreSQL or
# on SQLite's writer thread) it checks them as they come and forwards them only once `admit` is
# called. None where the query was not sent (the turn sends it as usual).
SendQuery = Callable[["TurnTicket", bool], SentQuery | None]


@dataclass(frozen=True)
class TurnTicket:
    """Handed to the stream handler when a turn may start."""

    session_id: str
    tenant: str
    agent_name: str
    sandbox_id: str
    query_id: str
    connection: Any  # BridgeConnection, used only on the event loop
    model: str | None
    started: float
    meter: Any = None  # the sandbox's ResourceMeter: limits hit, counted by the host's kernel
    cpu_at_start: float | None = None  # the sandbox's CPU seconds when the turn began (cgroup accounting)
    # The session's config changes (PATCH .../config) the live bridge has not seen: sent with the query.
    live_config: dict[str, Any] | None = None
    # The first of the event ids reserved with the user message (`EVENT_BLOCK` of them), or None.
    first_event: int | None = None
    # The query went to the bridge while the prompt was being stored (`SendQuery`): the turn reads
    # its frames and does not send it again.
    sent: bool = False

    def compute_seconds(self) -> float:
        """CPU time the sandbox used during the turn (every process in it, tools included); the
        turn's wall time where the host has no CPU accounting (weak isolation)."""
        now: float | None = self.meter.cpu_seconds() if self.meter is not None else None
        if now is None or self.cpu_at_start is None:
            return round(time.monotonic() - self.started, 3)
        return round(max(0.0, now - self.cpu_at_start), 3)
