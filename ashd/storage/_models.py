"""SQLAlchemy 2 table models for every stored resource.

Timestamps are stored as UTC; `UTCDateTime` gives back timezone-aware values on both SQLite (which
keeps no zone) and PostgreSQL. Identifiers are UUID strings. Per-session sequence counters live on
the session row and are advanced atomically (`storage/_sequence.py`), never by `max()+1`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, class_mapper, mapped_column


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_id() -> str:
    return str(uuid.uuid4())


def iso(value: dt.datetime | None) -> str | None:
    """The wire form of a timestamp: ISO 8601 in UTC with millisecond precision and a `Z`."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


Model = TypeVar("Model", bound="Base")


def from_row(cls: type[Model], values: Mapping[str, Any]) -> Model:
    """An instance holding `values` as the database returned them, built without the ORM's
    per-attribute events (a session row: 20 -> 1 us): a detached copy, never added to an ORM session."""
    instance: Model = class_mapper(cls).class_manager.new_instance()
    instance.__dict__.update(values)
    return instance


class UTCDateTime(TypeDecorator[dt.datetime]):
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map: dict[Any, Any] = {dt.datetime: UTCDateTime}


class Meta(Base):
    """Server-wide values shared by every coordinator (for example the API key HMAC secret)."""

    __tablename__ = "meta"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    label: Mapped[str | None] = mapped_column(String(255))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16), default="api")  # env | generated | api | operator
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class Agent(Base):
    __tablename__ = "agents"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_agents_tenant_name"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer, default=1)
    path: Mapped[str] = mapped_column(Text)
    managed: Mapped[bool] = mapped_column(Boolean, default=False)  # folder materialised by the server
    model: Mapped[str | None] = mapped_column(String(255))
    env_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)  # JSON object, AES-GCM encrypted
    network: Mapped[bool] = mapped_column(Boolean, default=False)
    # Bytes of the uploaded folders kept on disk (current and previous version; 0 for a `path`).
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    disk_mb: Mapped[int | None] = mapped_column(Integer, default=None)  # sandbox disk size; None: default
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_tenant_created", "tenant_id", "created_at"),
        Index("ix_sessions_status", "status"),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255))
    agent_name: Mapped[str] = mapped_column(String(255))
    sandbox_id: Mapped[str] = mapped_column(String(64), default="")
    status: Mapped[str] = mapped_column(String(16), default="starting")
    model: Mapped[str | None] = mapped_column(String(255))
    runner_id: Mapped[str | None] = mapped_column(String(255))
    parent_session_id: Mapped[str | None] = mapped_column(String(36))
    # The creation body's configuration (mcpServers, systemPrompt, permissionMode, tools, ...), JSON.
    config: Mapped[str] = mapped_column(Text, default="{}")
    # extraEnv may hold secrets: encrypted like credentials, never returned in clear.
    env_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    credential_id: Mapped[str | None] = mapped_column(String(36))
    error: Mapped[str | None] = mapped_column(Text)
    next_message_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    next_event_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    # A prompt is stored and its turn's `done` frame is not: a process that dies with this set left
    # the turn cut short, and the next start records it as interrupted (migration 4).
    turn_open: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What the session holds in the database (migration 3): kept by every write of its rows, so
    # what a tenant holds is one indexed sum, not a scan of its messages and events.
    message_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    event_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    next_model_call_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # migration 2
    # The process that hosts (or last hosted) the session's sandbox: a runner's SERVICE_RUNNER_ID, or a
    # server's id (SERVICE_SERVER_ID / `<data dir>/server-id`). A start-up sweep pauses only its own
    # (migration 11). Null on rows from before, and until a sandbox is claimed for a routed session.
    owner_id: Mapped[str | None] = mapped_column(String(255), default=None)
    next_log_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # migration 12
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_active_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("session_id", "sequence", name="uq_messages_session_seq"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    session_id: Mapped[str] = mapped_column(String(36), ForeignKey("sessions.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    sequence: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SessionEvent(Base):
    """Typed events of a session. Rows with `frame_event` set are also the SSE frames of the
    stream, replayable by `sequence` (the SSE `id:`)."""

    __tablename__ = "session_events"
    __table_args__ = (UniqueConstraint("session_id", "sequence", name="uq_events_session_seq"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    session_id: Mapped[str] = mapped_column(String(36), ForeignKey("sessions.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(255))
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[str | None] = mapped_column(Text)
    sequence: Mapped[int] = mapped_column(BigInteger)
    frame_event: Mapped[str | None] = mapped_column(String(16))
    frame_data: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class QueueItem(Base):
    __tablename__ = "queue_items"
    __table_args__ = (Index("ix_queue_status_priority", "status", "priority", "created_at"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    session_id: Mapped[str | None] = mapped_column(String(36))
    agent_name: Mapped[str] = mapped_column(String(255))
    prompt: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=3)
    error: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    completed_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    # The claim (migration 13): the server running a `processing` item and until when its claim
    # holds; a server that dies stops renewing it and the item goes back to `pending`.
    owner: Mapped[str | None] = mapped_column(String(255), default=None)
    lease_until: Mapped[dt.datetime | None] = mapped_column(default=None)
    result: Mapped[str | None] = mapped_column(Text, default=None)  # the turn's `result` text


class Attachment(Base):
    """A file a client attached to a session (`storage/_attachments.py`). The bytes are in the row
    (`content`, migration 14), so every coordinator serves them; `storage_path` predates that and is
    left empty."""

    __tablename__ = "attachments"
    __table_args__ = (Index("ix_attachments_session", "session_id", "created_at"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    message_id: Mapped[str | None] = mapped_column(String(36))
    session_id: Mapped[str] = mapped_column(String(36), ForeignKey("sessions.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(1024))
    mime_type: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    storage_path: Mapped[str] = mapped_column(Text, default="")
    content: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Credential(Base):
    __tablename__ = "credentials"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    type: Mapped[str] = mapped_column(String(32))
    label: Mapped[str | None] = mapped_column(String(255))
    secret_ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class UsageEvent(Base):
    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_tenant_created", "tenant_id", "created_at"),
        # Covers the sums of /api/usage/stats (every column they filter on or add up): an index-only
        # scan, not a table row looked up per record (docs/performance.md, thirty-ninth pass).
        Index("ix_usage_sums", "tenant_id", "event_type", "created_at", "agent_name", "value"),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[str] = mapped_column(String(36), index=True)
    agent_name: Mapped[str] = mapped_column(String(255))
    event_type: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelCall(Base):
    """One model call a sandbox made through the model proxy, as the server saw it (migration 2)."""

    __tablename__ = "model_calls"
    __table_args__ = (
        Index("ix_model_calls_session_seq", "session_id", "sequence"),
        Index("ix_model_calls_tenant_created", "tenant_id", "created_at"),
    )
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[str] = mapped_column(String(36))
    sequence: Mapped[int] = mapped_column(BigInteger, default=0)
    agent_name: Mapped[str] = mapped_column(String(255))
    sandbox_id: Mapped[str] = mapped_column(String(64))
    query_id: Mapped[str | None] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(255))
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_creation_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    first_byte_ms: Mapped[float | None] = mapped_column(Float)
    server: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SessionLog(Base):
    """One line of a session's logs (migration 12): its agent's setup output and its sandbox's stderr.
    `idx` counts from 0 per session (`next_log_seq`); old lines past the per-session bound are deleted."""

    __tablename__ = "session_logs"
    __table_args__ = (UniqueConstraint("session_id", "idx", name="uq_session_logs_session_idx"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(36), ForeignKey("sessions.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(255))
    idx: Mapped[int] = mapped_column(BigInteger)
    level: Mapped[str] = mapped_column(String(8))  # stdout, stderr or system
    source: Mapped[str] = mapped_column(String(16))  # setup or sandbox
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Runner(Base):
    __tablename__ = "runners"
    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    max_sandboxes: Mapped[int] = mapped_column(Integer, default=0)
    active_count: Mapped[int] = mapped_column(Integer, default=0)
    warming_count: Mapped[int] = mapped_column(Integer, default=0)
    running_count: Mapped[int] = mapped_column(Integer, default=0)
    stats: Mapped[str] = mapped_column(Text, default="{}")
    registered_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Set by the liveness sweep that found the runner silent (migration 11): a dead runner's heartbeat
    # answers 404 until it registers again, which clears this.
    dead_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class AgentVersion(Base):
    """One deployed version of a managed agent's folder, as a gzip tar (migration 10): any process
    (another coordinator, a runner) builds the folder from here into its own data dir."""

    __tablename__ = "agent_versions"
    __table_args__ = (UniqueConstraint("agent_id", "version", name="uq_agent_versions_agent_version"),)
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    agent_id: Mapped[str] = mapped_column(String(36), index=True)
    tenant_id: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # the files, uncompressed
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Webhook(Base):
    """A tenant's webhook (migration 15): where, which events, its secret (encrypted)."""
    __tablename__ = "webhooks"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(255), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[str] = mapped_column(Text)  # JSON array of event names
    description: Mapped[str | None] = mapped_column(Text, default=None)
    secret: Mapped[bytes] = mapped_column(LargeBinary)  # encrypted
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # When it last began to hear events, if not at its creation: its last enable (migration 16).
    listening_since: Mapped[dt.datetime | None] = mapped_column(default=None)


class WebhookDelivery(Base):
    """The webhook outbox (migration 15): one event for one hook, until delivered or failed."""
    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
                      Index("ix_webhook_deliveries_hook", "webhook_id", "created_at"))
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    webhook_id: Mapped[str] = mapped_column(String(36))
    tenant_id: Mapped[str] = mapped_column(String(255))
    event: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)  # the exact JSON sent, fixed at enqueue (signed per attempt)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(default=None)
