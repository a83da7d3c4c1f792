"""Every setting of ashd: name, type, default and meaning, declared once and validated at start.

Values come from the process environment (`SERVICE_*`, plus the standard `ANTHROPIC_BASE_URL` and
`ANTHROPIC_API_KEY`). A bad value raises ConfigError naming the variable and what it accepts; an
unknown `SERVICE_*` variable is reported with the closest known name, since a typo would otherwise
silently fall back to a default.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ashd.errors import ConfigError

if TYPE_CHECKING:
    from ashd.sandboxing import EgressPolicy

MIN_DISK_MB = 32  # a smaller ext4 image is mostly metadata and journal


@dataclass(frozen=True)
class Option:
    env: str
    attr: str
    kind: str  # human name of the accepted values, used in errors and the README table
    default: Any
    help: str
    parse: Callable[[str], Any]
    secret: bool = False


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(raw)


def _int_min(lo: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw.strip())
        if value < lo:
            raise ValueError(raw)
        return value

    return parse


def _disk_mb(raw: str) -> int:
    value = int(raw.strip())
    if value != 0 and value < MIN_DISK_MB:
        raise ValueError(raw)
    return value


def _float_pos(raw: str) -> float:
    value = float(raw.strip())
    if not value > 0:
        raise ValueError(raw)
    return value


def _float_nonneg(raw: str) -> float:
    value = float(raw.strip())
    if not value >= 0 or value == float("inf"):
        raise ValueError(raw)
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ValueError(raw)
        return value

    return parse


def _port(raw: str) -> int:
    value = int(raw.strip())
    if not 0 <= value <= 65535:
        raise ValueError(raw)
    return value


def _text(raw: str) -> str:
    return raw.strip()


def _opt_text(raw: str) -> str | None:
    return raw.strip() or None


def _agent_list(raw: str) -> tuple[str, ...]:
    """`tenant/agent` entries separated by commas; the agent part is a valid agent name."""
    entries = tuple(e.strip() for e in raw.split(",") if e.strip())
    for entry in entries:
        tenant, _, agent = entry.rpartition("/")
        if not tenant or not _AGENT_NAME.fullmatch(agent):
            raise ValueError(raw)
    return entries


_AGENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


def _db_url(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if not value.startswith(("sqlite", "postgres", "postgresql")):
        raise ValueError(raw)
    return value


def _snapshot_url(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if not value.startswith(("s3://", "file://")):
        raise ValueError(raw)
    return value


def _engine(raw: str) -> str:
    from ashd.engines import engine_problem

    name = raw.strip()
    problem = engine_problem(name)
    if problem:
        raise _Explained(problem)
    return name


class _Explained(ValueError):
    """A parse error whose message says why, shown after the accepted form."""


def _explained(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def wrapped(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError as exc:
            raise _Explained(str(exc)) from None

    return wrapped


@_explained
def _subnet(raw: str) -> str:
    from ashd.sandboxing import parse_subnet

    return str(parse_subnet(raw))


@_explained
def _dns_list(raw: str) -> str | None:
    from ashd.sandboxing import parse_dns

    return ",".join(str(a) for a in parse_dns(raw)) if raw.strip() else None


@_explained
def _egress_allow(raw: str) -> str | None:
    from ashd.sandboxing import parse_allow

    return ",".join(str(e) for e in parse_allow(raw)) or None


@_explained
def _webhook_allow(raw: str) -> str | None:
    from ashd.sandboxing import parse_webhook_allow

    return raw.strip() if parse_webhook_allow(raw) else None


def _http_url(raw: str) -> str | None:
    value = raw.strip().rstrip("/")
    if not value:
        return None
    if not value.startswith(("http://", "https://")):
        raise ValueError(raw)
    return value


def _float_pos_opt(raw: str) -> float | None:
    return _float_pos(raw) if raw.strip() else None


def _checked(check: Callable[[str], object]) -> Callable[[str], str | None]:
    """Keep the raw text (parsed again where it is used) once `check` accepts it."""
    def parse(raw: str) -> str | None:
        if not raw.strip():
            return None
        check(raw)
        return raw.strip()

    return parse


def _model_prices(raw: str) -> object:
    from ashd.pricing import parse_prices

    return parse_prices(raw)


def _tenant_budgets(raw: str) -> object:
    from ashd.sandboxing import parse_tenant_budgets

    return parse_tenant_budgets(raw)


OPTIONS: tuple[Option, ...] = (
    # --- the interface's names ---
    Option("SERVICE_MODE", "mode", "`standalone` or `coordinator`", "standalone",
           "Run a local sandbox pool (standalone) or route sessions to registered runners (coordinator).",
           _choice("standalone", "coordinator")),
    Option("SERVICE_DATABASE_URL", "database_url", "SQLAlchemy URL (`sqlite…` or `postgresql://…`)", None,
           "Database. Default: SQLite in WAL mode at `<data dir>/ashd.db`. "
           "`postgresql://user@host/db` uses asyncpg; required for several coordinators.", _db_url),
    Option("SERVICE_API_KEY", "api_key", "string", None,
           "An API key for tenant `default`: at least 32 random characters (a shorter one is warned "
           "about at start). Without it (and with no key stored) the first start generates one into "
           "`<data dir>/initial-api-key`.", _opt_text, secret=True),
    Option("SERVICE_INTERNAL_SECRET", "internal_secret", "string", None,
           "Bearer secret for every `/api/internal/*` endpoint (always required). Unset: generated "
           "once into `<data dir>/internal-secret` (mode 0600). Must be set, to the same value, on "
           "coordinators and runners.", _opt_text, secret=True),
    Option("SERVICE_MAX_SANDBOXES", "max_sandboxes", "integer ≥ 1", None,
           "Pool capacity. Default: host memory / per-sandbox memory limit, capped at 1000.", _int_min(1)),
    Option("SERVICE_SNAPSHOT_URL", "snapshot_url", "`s3://bucket/prefix` or `file:///path`", None,
           "Where workspace snapshots are also stored (local snapshots are always kept under the data dir).",
           _snapshot_url),
    Option("SERVICE_DEBUG_TIMING", "debug_timing", "boolean", False,
           "Write a `timing` JSON line per message on stderr.", _bool),
    Option("SERVICE_RUNNER_ID", "runner_id", "string", None, "Runner mode: this runner's id.", _opt_text),
    Option("SERVICE_SERVER_URL", "server_url", "http(s) URL", None,
           "Runner mode: the coordinator (or its load balancer) to register with.", _http_url),
    Option("SERVICE_RUNNER_PORT", "runner_port", "port", 4200,
           "Runner mode (and a coordinator with SERVICE_COORDINATOR_LOCAL): port of the runner API.", _port),
    Option("SERVICE_RUNNER_ADVERTISE_HOST", "runner_advertise_host", "host name or address", None,
           "Runner mode: host the coordinator should use to reach this runner.", _opt_text),
    # --- runner liveness (docs/liveness.md) ---
    Option("SERVICE_RUNNER_LIVENESS_SECONDS", "runner_liveness_seconds", "number > 0", 30.0,
           "Coordinator: a runner without a heartbeat for this long is dead; its `active`/`starting` "
           "sessions are paused.", _float_pos),
    Option("SERVICE_RUNNER_SWEEP_SECONDS", "runner_sweep_seconds", "number > 0", 30.0,
           "Coordinator: how often each coordinator looks for dead runners.", _float_pos),
    Option("SERVICE_RUNNER_SWEEP_JITTER_SECONDS", "runner_sweep_jitter_seconds", "number ≥ 0", 5.0,
           "Coordinator: random extra wait (0 to this) before each sweep, so coordinators started together "
           "do not sweep in step.", _float_nonneg),
    Option("SERVICE_SERVER_ID", "server_id", "string", None,
           "Id of this server as the owner of the sandboxes it hosts: its start-up sweep pauses only "
           "sessions it owned. Default: generated once into `<data dir>/server-id`; a runner uses "
           "SERVICE_RUNNER_ID.", _opt_text),
    Option("SERVICE_RUNNER_HEARTBEAT_SECONDS", "runner_heartbeat_seconds", "number > 0", 10.0,
           "Runner mode (and a coordinator's local pool): seconds between heartbeats (the pool's counts).",
           _float_pos),
    Option("SERVICE_COORDINATOR_LOCAL", "coordinator_local", "boolean", False,
           "Coordinator: also run a local sandbox pool, registered as a runner (runner API on SERVICE_RUNNER_PORT) "
           "and used when no runner has room (off: 503 instead).", _bool),
    # --- ashd's own ---
    Option("SERVICE_HOST", "host", "address", "0.0.0.0", "Address the HTTP server binds.", _text),
    Option("SERVICE_PORT", "port", "port", 4100, "Port the HTTP server binds.", _port),
    Option("SERVICE_DATA_DIR", "data_dir", "path", "./data",
           "Database, generated keys, agents, sandboxes and snapshots live here.", _text),
    Option("SERVICE_AGENT_ROOTS", "agent_roots", "paths separated by `:`", None,
           "Directories under which `POST /api/agents` may register a `path`: tenant `default` "
           "anywhere under them, other tenants only under `<root>/<tenant>/`. Unset: tenant `default` "
           "may use any folder with AGENT.md (never /proc, /sys, /dev or the data dir), other tenants "
           "only `<data dir>/library/<tenant>/`. See docs/security.md.", _opt_text),
    Option("SERVICE_LOG_LEVEL", "log_level", "`debug` `info` `warning` `error`", "info",
           "Minimum level of the JSON log lines on stderr.", _choice("debug", "info", "warning", "error")),
    Option("SERVICE_EVENT_LOOP", "event_loop", "`auto` `uvloop` `asyncio`", "auto",
           "The server's event loop: `auto` runs uvloop (libuv, in C: less CPU per request) when it is "
           "installed, as it is with ashd's own dependencies, and asyncio's own loop otherwise.",
           _choice("auto", "uvloop", "asyncio")),
    Option("SERVICE_RATE_LIMIT_RPS", "rate_limit_rps", "number > 0", 50.0,
           "Sustained requests per second allowed per API key (token bucket refill rate).", _float_pos),
    Option("SERVICE_RATE_LIMIT_BURST", "rate_limit_burst", "integer ≥ 1", 100,
           "Requests an API key may make in a burst (token bucket size).", _int_min(1)),
    Option("SERVICE_IDLE_TIMEOUT_SECONDS", "idle_timeout_seconds", "integer ≥ 1", 1800,
           "A session idle this long is snapshotted, its sandbox stopped and the session paused.", _int_min(1)),
    Option("SERVICE_CREDENTIAL_KEY", "credential_key", "64 hex chars or base64 of 32 bytes", None,
           "AES-256-GCM key for stored credentials. Default: generated once into "
           "`<data dir>/credential-key` (mode 0600).", _opt_text, secret=True),
    Option("SERVICE_SANDBOX_MEMORY_MB", "sandbox_memory_mb", "integer ≥ 32", 512,
           "Memory limit of one sandbox (cgroup), in MiB.", _int_min(32)),
    Option("SERVICE_SANDBOX_PIDS", "sandbox_pids", "integer ≥ 8", 256,
           "Maximum processes and threads in one sandbox (cgroup pids).", _int_min(8)),
    Option("SERVICE_SANDBOX_CPU", "sandbox_cpu", "number > 0 (cores)", 1.0,
           "CPU limit of one sandbox, in cores (cgroup cpu quota).", _float_pos),
    Option("SERVICE_SANDBOX_DISK_MB", "sandbox_disk_mb", f"0, or integer ≥ {MIN_DISK_MB}", 1024,
           "Disk quota of one sandbox, in MiB: its workspace, HOME and /tmp live on a loop-mounted ext4 "
           "image of this size, so writing past it fails with \"No space left on device\". Agents "
           "(`diskMb`) and sessions (`diskMb`) may ask for another size up to "
           "`SERVICE_SANDBOX_DISK_MAX_MB`. 0: no quota (a sandbox can fill the data dir's disk).", _disk_mb),
    Option("SERVICE_SANDBOX_DISK_MAX_MB", "sandbox_disk_max_mb", f"integer ≥ {MIN_DISK_MB}", 4096,
           "Largest disk an agent or a session may ask for (`diskMb`), in MiB.", _int_min(MIN_DISK_MB)),
    Option("SERVICE_SANDBOX_DISK_PREALLOCATE", "sandbox_disk_preallocate", "boolean", False,
           "Reserve each sandbox's whole disk on the data dir when the sandbox is made, so that all "
           "sandboxes together never need more than the disk has (a sandbox that does not fit is "
           "refused with 503). Off: disk images are sparse and use only what is written, so the sum "
           "of the quotas may exceed the free space.", _bool),
    Option("SERVICE_SANDBOX_NETWORK", "sandbox_network", "boolean", False,
           "Give every sandbox network access: its own network namespace behind NAT, limited by the "
           "`SERVICE_SANDBOX_EGRESS_*` rules (never the host, its networks or private ranges). Off: no "
           "network; the model is reached through the server. Agents and sessions can opt in one by one.",
           _bool),
    Option("SERVICE_SANDBOX_NETWORK_SUBNET", "sandbox_network_subnet", "private IPv4 CIDR, /8 to /30",
           "10.213.0.0/16",
           "Addresses of networked sandboxes (a /31 each, NATed to the host's address). Must not overlap "
           "any network the host uses.", _subnet),
    Option("SERVICE_SANDBOX_NETWORK_DNS", "sandbox_network_dns", "IPv4 addresses separated by `,`", None,
           "DNS resolvers of networked sandboxes; only these are reachable, on port 53 only. Default: the "
           "host's non-loopback resolvers (systemd-resolved's upstream ones behind a 127.0.0.53 stub).",
           _dns_list),
    Option("SERVICE_SANDBOX_EGRESS_ALLOW", "sandbox_egress_allow",
           "IPv4 addresses or CIDRs, each optionally `:port`, separated by `,`", None,
           "Operator allowlist: destinations networked sandboxes may reach although they are private, "
           "link-local or on the host's own networks (e.g. `10.1.2.0/24:443`). The host itself and "
           "loopback are never reachable.", _egress_allow),
    Option("SERVICE_SANDBOX_EGRESS_PUBLIC", "sandbox_egress_public", "boolean", True,
           "Networked sandboxes may reach public internet addresses. Off: only the allowlist and DNS.",
           _bool),
    # --- webhooks (docs/webhooks.md) ---
    Option("SERVICE_WEBHOOK_ALLOW", "webhook_allow",
           "IP addresses or CIDRs, each optionally `:port` (`[v6]:port`), separated by `,`", None,
           "Destinations webhooks may be delivered to although they are loopback, private or link-local "
           "(besides SERVICE_SANDBOX_EGRESS_ALLOW, which webhooks also follow), e.g. `127.0.0.1:9000` for a "
           "receiver on this host. Unset: public addresses only.", _webhook_allow),
    Option("SERVICE_WEBHOOK_MAX_ATTEMPTS", "webhook_max_attempts", "integer ≥ 1", 8,
           "Attempts per webhook delivery before it is marked `failed`.", _int_min(1)),
    Option("SERVICE_WEBHOOK_TIMEOUT_SECONDS", "webhook_timeout_seconds", "number > 0", 10.0,
           "Time one delivery attempt may take (connect, send, answer) before it counts as failed.", _float_pos),
    Option("SERVICE_WEBHOOK_BACKOFF_SECONDS", "webhook_backoff_seconds", "number > 0", 10.0,
           "Wait before the second attempt of a delivery; doubled after each further failure (at most 1 h).",
           _float_pos),
    Option("SERVICE_WEBHOOK_CONCURRENCY", "webhook_concurrency", "integer ≥ 1", 8,
           "Deliveries this server sends at once.", _int_min(1)),
    Option("SERVICE_SANDBOX_PTRACE_AGENTS", "sandbox_ptrace_agents", "`tenant/agent` names separated by `,`", (),
           "Agents whose sandboxes run the `ptrace` seccomp profile instead of `default`: the default filter "
           "plus ptrace, process_vm_readv/writev and personality(ADDR_NO_RANDOMIZE), for debuggers and "
           "profilers (gdb, strace, py-spy). Processes of one sandbox can then trace each other; user "
           "namespaces, mount, bpf and keyctl stay denied. Empty: every sandbox runs `default`.",
           _agent_list),
    Option("SERVICE_ALLOW_WEAK_ISOLATION", "allow_weak_isolation", "boolean", False,
           "Start even where bubblewrap or cgroups are missing (sandboxes are then plain child "
           "processes). Reported at start and in /health.", _bool),
    Option("SERVICE_PREWARM", "prewarm", "integer ≥ 0", 2,
           "Generic sandboxes kept started and ready to be claimed by new sessions. A claimed one is "
           "replaced in the next quiet moment (no request in flight for 5 ms, or 0.1 s later at most), so its "
           "start never takes the CPU from the requests running.", _int_min(0)),
    Option("SERVICE_ZYGOTE", "zygote", "boolean", True,
           "Start sandboxes from a fork server that has the bridge imported (milliseconds instead of "
           "about 1.5 s per cold sandbox).", _bool),
    Option("SERVICE_SETUP_TIMEOUT_SECONDS", "setup_timeout_seconds", "integer ≥ 1", 300,
           "Time allowed for `package.json` installation and for `setup.sh`, each.", _int_min(1)),
    Option("SERVICE_SETUP_LOG_LINES", "setup_log_lines", "integer ≥ 1", 1000,
           "Lines of an agent's setup output (`npm install`, `setup.sh`) stored per setup, as session events and "
           "logs; past it the rest is counted in one note (the whole output stays in the sandbox).", _int_min(1)),
    Option("SERVICE_SESSION_LOG_LINES", "session_log_lines", "integer ≥ 1", 10000,
           "Lines `GET /api/sessions/{id}/logs` keeps per session (setup output and the sandbox's stderr); "
           "older lines go as newer ones come.", _int_min(1)),
    Option("SERVICE_ACTOR_TIMEOUT_SECONDS", "actor_timeout_seconds", "number > 0", 60.0,
           "Longest wait for an internal component to answer before the request fails with 503.", _float_pos),
    Option("SERVICE_MAX_BODY_BYTES", "max_body_bytes", "integer ≥ 1024", 20 * 1024 * 1024,
           "Largest request body accepted (413 above it).", _int_min(1024)),
    Option("SERVICE_SHUTDOWN_GRACE_SECONDS", "shutdown_grace_seconds", "number > 0", 10.0,
           "Time running turns get to finish at a graceful stop, and an interrupted turn to end before "
           "a session's stop or DELETE lets its sandbox go under it.", _float_pos),
    # --- what tenants can make the server store, and the data disk (docs/security.md) ---
    Option("SERVICE_TENANT_STORAGE_MB", "tenant_storage_mb", "integer ≥ 0", 10240,
           "Most a tenant may hold on the server, in MiB: uploaded agent folders, workspace snapshots, "
           "stored messages and events. At the limit new sessions, messages and agent deploys get 409 "
           "until the tenant deletes something (`GET /api/storage` shows what it holds). 0: no limit.",
           _int_min(0)),
    Option("SERVICE_TENANT_MAX_AGENTS", "tenant_max_agents", "integer ≥ 0", 100,
           "Agents one tenant may register (409 above it). 0: no limit.", _int_min(0)),
    Option("SERVICE_TENANT_MAX_CREDENTIALS", "tenant_max_credentials", "integer ≥ 0", 100,
           "Credentials one tenant may store (409 above it). 0: no limit.", _int_min(0)),
    Option("SERVICE_TENANT_MAX_API_KEYS", "tenant_max_api_keys", "integer ≥ 0", 100,
           "API keys one tenant may mint for itself with `POST /api/api-keys` (409 above it). 0: no limit.",
           _int_min(0)),
    Option("SERVICE_AGENT_MAX_UPLOAD_MB", "agent_max_upload_mb", "integer ≥ 1", 50,
           "Largest agent folder one deploy may upload (`files` plus `systemPrompt`), in MiB (413 above "
           "it). The server keeps the current and the previous version of each uploaded agent.",
           _int_min(1)),
    Option("SERVICE_ATTACHMENT_MAX_MB", "attachment_max_mb", "integer ≥ 1", 10,
           "Largest attachment one `POST /api/sessions/{id}/attachments` may upload, in MiB (413 above it). "
           "Its base64 must also fit SERVICE_MAX_BODY_BYTES.",
           _int_min(1)),
    Option("SERVICE_SNAPSHOTS_KEEP", "snapshots_keep", "integer ≥ 1", 3,
           "Workspace snapshots kept per session (older ones are deleted). A pause, stop or DELETE that "
           "finds the workspace unchanged since the latest snapshot writes none.", _int_min(1)),
    Option("SERVICE_SNAPSHOT_MAX_MB", "snapshot_max_mb", "integer ≥ 1", 1024,
           "Largest workspace a snapshot stores (the bytes of its files), in MiB. A bigger workspace is "
           "not snapshotted: the previous snapshot is kept and stop answers 413.", _int_min(1)),
    Option("SERVICE_TURN_MAX_STORED_MB", "turn_max_stored_mb", "integer ≥ 1", 64,
           "Most one turn may store (its messages and events), in MiB. At the limit the turn is "
           "stopped: an `error` frame says so, then `done`.", _int_min(1)),
    Option("SERVICE_TURN_MAX_EVENTS", "turn_max_events", "integer ≥ 10", 10000,
           "Most stored events (frames and typed events) one turn may produce; then as above.", _int_min(10)),
    Option("SERVICE_DATA_DIR_MIN_FREE_MB", "data_dir_min_free_mb", "integer ≥ 0", 256,
           "Free space kept in reserve on the data dir's filesystem, in MiB. Below it, requests that add "
           "stored data (new sessions, messages, resumes, deploys, uploads) get 507, so running turns, "
           "snapshots and the database can finish their writes. 0: no reserve.", _int_min(0)),
    Option("SERVICE_DATA_DIR_WARN_FREE_MB", "data_dir_warn_free_mb", "integer ≥ 0", 2048,
           "Below this much free space on the data dir, `/health` reports `dataDir.state: low` and a "
           "warning is logged.", _int_min(0)),
    Option("SERVICE_STORAGE_RETRY_SECONDS", "storage_retry_seconds", "number > 0", 30.0,
           "How long the end of a turn keeps retrying to store its frames while the disk is full or the "
           "database unreachable; after that an `error` frame names the frames that were not stored.",
           _float_pos),
    # --- queue (docs/queue.md) ---
    Option("SERVICE_QUEUE_CONCURRENCY", "queue_concurrency", "integer ≥ 0", 4,
           "Queue items this server runs at once (each is a turn in a session). 0: this server runs no "
           "queue items (others sharing the database still do).", _int_min(0)),
    Option("SERVICE_QUEUE_CONCURRENCY_PER_TENANT", "queue_concurrency_per_tenant", "integer ≥ 1", 2,
           "Queue items one tenant may have running at once, over every server sharing the database.",
           _int_min(1)),
    Option("SERVICE_TENANT_MAX_QUEUED", "tenant_max_queued", "integer ≥ 0", 1000,
           "Queue items one tenant may have waiting or running (`pending` and `processing`); more are "
           "refused with 409 until some finish or are cancelled. 0: no limit.", _int_min(0)),
    Option("SERVICE_QUEUE_RETRY_SECONDS", "queue_retry_seconds", "number > 0", 5.0,
           "First delay before a failed queue item is tried again; each further retry doubles it.", _float_pos),
    Option("SERVICE_QUEUE_RETRY_MAX_SECONDS", "queue_retry_max_seconds", "number > 0", 300.0,
           "Longest delay between two tries of a queue item.", _float_pos),
    Option("SERVICE_QUEUE_LEASE_SECONDS", "queue_lease_seconds", "number > 0", 30.0,
           "How long a server's claim on a running queue item lasts unless renewed (it renews every "
           "third of it): an item of a server that died runs again after at most this long.", _float_pos),
    # --- model traffic (the model proxy: docs/security.md "Model traffic") ---
    Option("SERVICE_MODEL_ALLOW", "model_allow", "model names or globs separated by `,`", None,
           "Models every session may call besides its turn's model (the model precedence) and the models "
           "its agent allows (`allowedModels` in `.agent/settings.json`). `*` allows any model.", _opt_text),
    Option("SERVICE_MODEL_MAX_TOKENS", "model_max_tokens", "integer ≥ 1", 32000,
           "Largest `max_tokens` a model call from a sandbox may ask for; a call above it is refused (400).",
           _int_min(1)),
    Option("SERVICE_ENGINE", "engine", "`builtin` or `claude-agent-sdk`", "builtin",
           "Engine of agents whose `.agent/settings.json` names no `engine`: the built-in loop, or the Claude "
           "Agent SDK's Claude Code CLI (needs the `sdk` extra). See docs/engines.md.", _engine),
    Option("SERVICE_MODEL_CONTEXT_WINDOW", "model_context_window", "integer ≥ 1024 (tokens)", 200_000,
           "Context window the built-in engine assumes for a model it does not know (it knows the Claude "
           "models'); a conversation nearing the window is compacted (docs/engines.md).", _int_min(1024)),
    Option("SERVICE_MODEL_RATE_PER_MINUTE", "model_rate_per_minute", "number > 0", 120.0,
           "Model calls one session may make per minute, sustained; more are refused (429, Retry-After).",
           _float_pos),
    Option("SERVICE_MODEL_RATE_BURST", "model_rate_burst", "integer ≥ 1", 30,
           "Model calls one session may make in a burst before the per-minute rate applies.", _int_min(1)),
    Option("SERVICE_MODEL_SESSION_BUDGET_USD", "model_session_budget_usd", "number > 0 (USD)", None,
           "Model spend allowed to one session over its whole life, priced by the price table; calls past "
           "it are refused (402). Unset: no limit.", _float_pos_opt),
    Option("SERVICE_MODEL_TENANT_BUDGET_USD", "model_tenant_budget_usd", "number > 0 (USD)", None,
           "Model spend allowed to each tenant per calendar month (UTC), summed over every server that "
           "shares the database; calls past it are refused (402). Unset: no limit.", _float_pos_opt),
    Option("SERVICE_MODEL_TENANT_BUDGETS", "model_tenant_budgets", "`tenant=usd` pairs separated by `,`", None,
           "Monthly budgets of the tenants named, replacing SERVICE_MODEL_TENANT_BUDGET_USD for them.",
           _checked(_tenant_budgets)),
    Option("SERVICE_MODEL_PRICES", "model_prices", "JSON object, or the path of a JSON file", None,
           "Prices in USD per million tokens that override or extend the built-in table, e.g. "
           "`{\"claude-opus-4-1\": {\"input\": 15, \"output\": 75, \"cacheWrite\": 18.75, "
           "\"cacheRead\": 1.5}}`; a key matches a model name as a substring, or as a glob with `*`. "
           "Unknown models are priced as the most expensive entry.", _checked(_model_prices)),
    Option("ANTHROPIC_BASE_URL", "anthropic_base_url", "http(s) URL", "https://api.anthropic.com",
           "Model API the server forwards sandbox model traffic to.", _http_url),
    Option("ANTHROPIC_API_KEY", "anthropic_api_key", "string", None,
           "Server-wide model API key, used when a session has no credential.", _opt_text, secret=True),
)

_BY_ENV = {o.env: o for o in OPTIONS}
# Variables that are not options but are legitimately set by tooling or tests.
_KNOWN_EXTRA = frozenset({"SERVICE_TEST_POSTGRES_URL"})


@dataclass(frozen=True)
class Settings:
    mode: str = "standalone"
    database_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    internal_secret: str | None = field(default=None, repr=False)
    max_sandboxes: int | None = None
    snapshot_url: str | None = None
    debug_timing: bool = False
    runner_id: str | None = None
    server_url: str | None = None
    runner_port: int = 4200
    runner_advertise_host: str | None = None
    runner_liveness_seconds: float = 30.0
    runner_sweep_seconds: float = 30.0
    runner_sweep_jitter_seconds: float = 5.0
    server_id: str | None = None
    runner_heartbeat_seconds: float = 10.0
    coordinator_local: bool = False
    host: str = "0.0.0.0"
    port: int = 4100
    data_dir: str = "./data"
    agent_roots: str | None = None
    log_level: str = "info"
    event_loop: str = "auto"
    rate_limit_rps: float = 50.0
    rate_limit_burst: int = 100
    idle_timeout_seconds: int = 1800
    credential_key: str | None = field(default=None, repr=False)
    sandbox_memory_mb: int = 512
    sandbox_pids: int = 256
    sandbox_cpu: float = 1.0
    sandbox_disk_mb: int = 1024
    sandbox_disk_max_mb: int = 4096
    sandbox_disk_preallocate: bool = False
    sandbox_network: bool = False
    sandbox_network_subnet: str = "10.213.0.0/16"
    sandbox_network_dns: str | None = None
    sandbox_egress_allow: str | None = None
    sandbox_egress_public: bool = True
    sandbox_ptrace_agents: tuple[str, ...] = ()
    webhook_allow: str | None = None
    webhook_max_attempts: int = 8
    webhook_timeout_seconds: float = 10.0
    webhook_backoff_seconds: float = 10.0
    webhook_concurrency: int = 8
    allow_weak_isolation: bool = False
    prewarm: int = 2
    zygote: bool = True
    setup_timeout_seconds: int = 300
    setup_log_lines: int = 1000
    session_log_lines: int = 10000
    actor_timeout_seconds: float = 60.0
    max_body_bytes: int = 20 * 1024 * 1024
    shutdown_grace_seconds: float = 10.0
    tenant_storage_mb: int = 10240
    tenant_max_agents: int = 100
    tenant_max_credentials: int = 100
    tenant_max_api_keys: int = 100
    agent_max_upload_mb: int = 50
    attachment_max_mb: int = 10
    snapshots_keep: int = 3
    snapshot_max_mb: int = 1024
    turn_max_stored_mb: int = 64
    turn_max_events: int = 10000
    data_dir_min_free_mb: int = 256
    data_dir_warn_free_mb: int = 2048
    storage_retry_seconds: float = 30.0
    queue_concurrency: int = 4
    queue_concurrency_per_tenant: int = 2
    tenant_max_queued: int = 1000
    queue_retry_seconds: float = 5.0
    queue_retry_max_seconds: float = 300.0
    queue_lease_seconds: float = 30.0
    model_allow: str | None = None
    model_max_tokens: int = 32000
    model_context_window: int = 200_000
    engine: str = "builtin"
    model_rate_per_minute: float = 120.0
    model_rate_burst: int = 30
    model_session_budget_usd: float | None = None
    model_tenant_budget_usd: float | None = None
    model_tenant_budgets: str | None = None
    model_prices: str | None = None
    anthropic_base_url: str | None = "https://api.anthropic.com"
    anthropic_api_key: str | None = field(default=None, repr=False)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def agent_root_paths(self) -> tuple[Path, ...]:
        if not self.agent_roots:
            return ()
        return tuple(Path(p).expanduser().resolve() for p in self.agent_roots.split(":") if p.strip())

    def seccomp_profile(self, tenant: str, agent: str) -> str:
        """The seccomp profile of this tenant's agent's sandboxes."""
        return "ptrace" if f"{tenant}/{agent}" in self.sandbox_ptrace_agents else "default"

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_path / 'ashd.db'}"

    def egress_policy(self) -> EgressPolicy:
        from ashd.sandboxing import EgressPolicy

        return EgressPolicy.parse(subnet=self.sandbox_network_subnet, dns=self.sandbox_network_dns,
                                  allow=self.sandbox_egress_allow, public=self.sandbox_egress_public)

    def with_(self, **changes: Any) -> Settings:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[str] = []
    for opt in OPTIONS:
        raw = env.get(opt.env)
        if raw is None:
            continue
        try:
            values[opt.attr] = opt.parse(raw)
        except ValueError as exc:
            shown = "(hidden)" if opt.secret else repr(raw)
            why = f" ({exc})" if isinstance(exc, _Explained) else ""
            problems.append(f"{opt.env}={shown} is not valid: it accepts {opt.kind}{why}")
    for name in env:
        if name.startswith("SERVICE_") and name not in _BY_ENV and name not in _KNOWN_EXTRA:
            close = difflib.get_close_matches(name, list(_BY_ENV), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{name} is not a known setting{hint}")
    settings = Settings(**values)
    if settings.mode == "coordinator" and not settings.internal_secret:
        problems.append("SERVICE_INTERNAL_SECRET must be set when SERVICE_MODE=coordinator")
    if (settings.server_url or settings.runner_id) and not settings.internal_secret:
        # A runner proves itself to its coordinator with the shared secret; a generated one cannot match.
        problems.append("SERVICE_INTERNAL_SECRET must be set on a runner (SERVICE_SERVER_URL or "
                        "SERVICE_RUNNER_ID given), to the coordinator's value")
    if settings.sandbox_disk_mb > settings.sandbox_disk_max_mb:
        problems.append(f"SERVICE_SANDBOX_DISK_MB={settings.sandbox_disk_mb} is above "
                        f"SERVICE_SANDBOX_DISK_MAX_MB={settings.sandbox_disk_max_mb}; raise the maximum")
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def options_markdown() -> str:
    """The README's configuration table, generated so it never drifts from the code."""
    rows = ["| variable | accepts | default | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        default = "—" if opt.default in (None, ()) else f"`{opt.default}`"
        rows.append(f"| `{opt.env}` | {opt.kind} | {default} | {opt.help} |")
    return "\n".join(rows)
