"""The running server's components, built by `ashd.app` in start order and handed to HTTP."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ashd.config import Settings
from ashd.storage import Database
from ashd.storage._apikeys import ApiKeys
from ashd.storage._crypto import Cipher

if TYPE_CHECKING:
    from ashd.backends import SessionBackend
    from ashd.http._auth import KeyCache
    from ashd.http._ratelimit import RateLimiter
    from ashd.metrics import Metrics
    from ashd.storage._diskspace import DataDirSpace


def coordinator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Services:
    settings: Settings
    db: Database
    api_keys: ApiKeys
    cipher: Cipher
    key_cache: KeyCache
    rate_limiter: RateLimiter
    metrics: Metrics
    # The bearer secret of /api/internal/*: SERVICE_INTERNAL_SECRET or the generated one. Never empty.
    internal_secret: str = field(repr=False)
    started_at: float = field(default_factory=time.monotonic)
    coordinator_id: str = field(default_factory=coordinator_id)
    # Filled by later start steps (actors); typed loosely here to keep this module a leaf.
    isolation: Any = None
    pool: Any = None
    sessions: Any = None
    backend: SessionBackend | None = None  # where sessions run: the one way in for the HTTP layer
    model_proxy: Any = None  # ModelProxy: the sandboxes' model traffic, metered and recorded
    snapshots: Any = None
    runners: Any = None
    data_space: DataDirSpace | None = None  # free space on the data dir (reserve, /health, metrics)
    snapshot_board: Any = None  # SnapshotBoard: each session's local snapshots (count, bytes)
    tenant_storage: Any = None  # TenantStorage: what each tenant holds, its limits (GET /api/storage)
    extras: dict[str, Any] = field(default_factory=dict)

    def uptime(self) -> int:
        return int(time.monotonic() - self.started_at)
