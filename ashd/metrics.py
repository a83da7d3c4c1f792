"""The Prometheus series of the interface, on an explicit registry (fresh per server and per test)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

# The interface lists exactly these series; `_created` companions would be extra series.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

if TYPE_CHECKING:
    from ashd.storage._diskspace import DiskSpace

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
POOL_STATES = ("cold", "warming", "warm", "waiting", "running")


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
