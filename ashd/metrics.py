"""The Prometheus series of the interface, and the model proxy's `ash_model_*` series, on an explicit
registry (fresh per server and per test)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# The interface lists exactly these series; `_created` companions would be extra series.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

if TYPE_CHECKING:
    from ashd.storage import DiskSpace

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
POOL_STATES = ("cold", "warming", "warm", "waiting", "running")
# The model label comes from what a sandbox asked for: bounded, so a sandbox cycling through made-up
# model names cannot grow /metrics without end.
MAX_MODEL_LABELS = 100
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._:@/-]")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.up = Gauge("ash_up", "1 if the server is reachable", registry=r)
        self.uptime = Gauge("ash_uptime_seconds", "Seconds since process start", registry=r)
        self.active_sessions = Gauge("ash_active_sessions", "Sessions in active status", registry=r)
        self.active_sandboxes = Gauge("ash_active_sandboxes", "Live sandbox processes", registry=r)
        self.pool = Gauge("ash_pool_sandboxes", "Sandboxes per pool state", ["state"], registry=r)
        self.max_capacity = Gauge("ash_pool_max_capacity", "Configured maximum pool capacity", registry=r)
        self.resumes = Counter("ash_resume", "Session resumes by path", ["path"], registry=r)
        self.data_free = Gauge("ash_data_dir_free_bytes", "Free bytes on the data dir's filesystem", registry=r)
        self.data_size = Gauge("ash_data_dir_size_bytes", "Size of the data dir's filesystem in bytes", registry=r)
        self.limit_hits = Counter("ash_sandbox_limit_hits", "Sandbox limits hit (OOM kills, refused forks, "
                                  "full disks), as reported to sessions", ["limit"], registry=r)
        self.model_requests = Counter("ash_model_requests", "Model calls forwarded by the model proxies, by "
                                      "model and outcome (ok, error, aborted)", ["model", "outcome"], registry=r)
        self.model_tokens = Counter("ash_model_tokens", "Tokens the model API reported, by model and type "
                                    "(input, output, cache_creation, cache_read)", ["model", "type"], registry=r)
        self.model_cost = Counter("ash_model_cost_usd", "Cost of the model calls in USD (price table)", ["model"],
                                  registry=r)
        self.model_refusals = Counter("ash_model_refusals", "Model calls refused by the model proxies, by model "
                                      "and reason", ["model", "reason"], registry=r)
        self.model_seconds = Histogram("ash_model_request_duration_seconds", "Duration of forwarded model calls",
                                       ["model"], registry=r,
                                       buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600))
        # Runners (coordinator mode), refreshed from the shared database at each scrape; the
        # counters are this coordinator's own sweeps.
        self.runners = Gauge("ash_runners", "Registered runners by state (alive, stale: heartbeat late but not "
                             "yet swept, dead)", ["state"], registry=r)
        self.runner_capacity = Gauge("ash_runner_max_sandboxes", "Sandbox capacity of each live runner",
                                     ["runner"], registry=r)
        self.runner_running = Gauge("ash_runner_running_sandboxes", "Running sandboxes of each live runner "
                                    "(last heartbeat)", ["runner"], registry=r)
        self.runner_warming = Gauge("ash_runner_warming_sandboxes", "Warming sandboxes of each live runner "
                                    "(last heartbeat)", ["runner"], registry=r)
        self.runner_sweeps = Counter("ash_runner_sweeps", "Runner liveness sweeps run by this coordinator",
                                     registry=r)
        self.runners_lost = Counter("ash_runners_lost", "Runners this coordinator's sweeps marked dead",
                                    registry=r)
        self.runner_lost_paused = Counter("ash_runner_lost_sessions_paused", "Sessions paused by this "
                                          "coordinator's sweeps because their runner was lost", registry=r)
        self.queue_items = Gauge("ash_queue_items", "Queue items per status, over every server sharing the "
                                 "database", ["status"], registry=r)
        self.queue_running = Gauge("ash_queue_running", "Queue items this server is running", registry=r)
        self.queue_attempts = Counter("ash_queue_attempts", "Queue item attempts this server ran, by outcome "
                                      "(completed, retry, failed, lost: the claim had expired)", ["outcome"],
                                      registry=r)
        self._model_labels: set[str] = set()
        self.up.set(1)
        for state in POOL_STATES:
            self.pool.labels(state=state)
        for path in ("warm", "cold"):
            self.resumes.labels(path=path)
        for limit in ("memory", "pids", "disk"):
            self.limit_hits.labels(limit=limit)

    def refresh(self, *, uptime: int, active_sessions: int, pool: Mapping[str, int],
                data_space: DiskSpace | None = None) -> None:
        self.uptime.set(uptime)
        self.active_sessions.set(active_sessions)
        live = sum(pool.get(s, 0) for s in ("warming", "warm", "waiting", "running"))
        self.active_sandboxes.set(live)
        for state in POOL_STATES:
            self.pool.labels(state=state).set(pool.get(state, 0))
        self.max_capacity.set(pool.get("maxCapacity", 0))
        if data_space is not None:
            self.data_free.set(data_space.free_bytes)
            self.data_size.set(data_space.total_bytes)

    def runner_sweep(self, lost: int, paused: int) -> None:
        self.runner_sweeps.inc()
        self.runners_lost.inc(lost)
        self.runner_lost_paused.inc(paused)

    def refresh_runners(self, counts: Mapping[str, int], live: Sequence[tuple[str, int, int, int]]) -> None:
        """`counts`: runners by state; `live`: (runner id, max sandboxes, running, warming) of each
        alive runner. Series of runners that are gone are dropped."""
        for state in ("alive", "stale", "dead"):
            self.runners.labels(state=state).set(counts.get(state, 0))
        for gauge in (self.runner_capacity, self.runner_running, self.runner_warming):
            gauge.clear()
        for runner_id, capacity, running, warming in live:
            label = _LABEL_CHARS.sub("_", runner_id)[:128]
            self.runner_capacity.labels(runner=label).set(capacity)
            self.runner_running.labels(runner=label).set(running)
            self.runner_warming.labels(runner=label).set(warming)
    def refresh_queue(self, stats: Mapping[str, int], running: int) -> None:
        for status, count in stats.items():
            self.queue_items.labels(status=status).set(count)
        self.queue_running.set(running)

    def count_queue_attempt(self, outcome: str) -> None:
        self.queue_attempts.labels(outcome=outcome).inc()

    def count_resume(self, path: str) -> None:
        self.resumes.labels(path=path).inc()

    def count_limit_hit(self, limit: str) -> None:
        self.limit_hits.labels(limit=limit).inc()

    def _model(self, model: str) -> str:
        label = _LABEL_CHARS.sub("_", model)[:64] or "none"
        if label not in self._model_labels:
            if len(self._model_labels) >= MAX_MODEL_LABELS:
                return "other"
            self._model_labels.add(label)
        return label

    def model_call(self, model: str, outcome: str, tokens: Mapping[str, int], cost_usd: float,
                   seconds: float) -> None:
        label = self._model(model)
        self.model_requests.labels(model=label, outcome=outcome).inc()
        for kind, count in tokens.items():
            if count > 0:
                self.model_tokens.labels(model=label, type=kind).inc(count)
        if cost_usd > 0:
            self.model_cost.labels(model=label).inc(cost_usd)
        self.model_seconds.labels(model=label).observe(seconds)

    def model_refusal(self, model: str, reason: str) -> None:
        self.model_refusals.labels(model=self._model(model), reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
