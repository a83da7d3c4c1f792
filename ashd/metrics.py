"""The Prometheus series of the interface, and the model proxy's `ash_model_*` series, on an explicit
registry (fresh per server and per test)."""

from __future__ import annotations

import re
from collections.abc import Mapping
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
