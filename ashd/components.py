"""What a running server holds, typed: built by `ashd.app` in start order and handed to the HTTP layer.

No import of `ashd.http` (the HTTP layer's own state, the key cache and the rate limiter, are its
app keys), and nothing here is filled in later: `ashd.app` builds this once everything has started.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ashd.actors import QueueService, WebhookDispatcher
from ashd.backends import SessionBackend
from ashd.config import Settings
from ashd.metrics import Metrics
from ashd.runtime import LocalSessions
from ashd.sandboxing import IsolationReport, ModelProxy
from ashd.storage import Agents, ApiKeys, Cipher, Credentials, Database, DataDirSpace, TenantStorage


def coordinator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Components:
    settings: Settings
    db: Database
    api_keys: ApiKeys
    cipher: Cipher
    agents: Agents
    credentials: Credentials
    metrics: Metrics
    data_space: DataDirSpace  # free space on the data dir (reserve, /health, metrics)
    tenant_storage: TenantStorage  # what each tenant holds, its limits (GET /api/storage)
    sessions: SessionBackend  # where sessions run: the HTTP layer's one way to them
    model_proxy: ModelProxy | None  # the sandboxes' model traffic, metered and recorded
    pool_stats: Callable[[], Mapping[str, int]]  # the sandbox pool's counts (/health, metrics)
    isolation: IsolationReport | None  # how sandboxes are isolated on this host (/health)
    local: LocalSessions | None  # this process's sandboxes and actors, when it runs them
    webhooks: WebhookDispatcher  # the webhook outbox: events stored, sent in the background
    # The bearer secret of /api/internal/*: SERVICE_INTERNAL_SECRET or the generated one. Never empty.
    internal_secret: str = field(repr=False)
    coordinator_id: str = field(default_factory=coordinator_id)
    queue: QueueService | None = None  # the queue actor and its ticker: queued prompts run as turns
    started_at: float = field(default_factory=time.monotonic)

    def uptime(self) -> int:
        return int(time.monotonic() - self.started_at)
