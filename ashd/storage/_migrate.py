"""Schema migrations, run at every start.

A small ordered list instead of alembic: each step runs in its own transaction and is recorded in
`schema_migrations`; on PostgreSQL an advisory lock keeps several coordinators starting at once
from racing. Steps are append-only: never edit a released step, add a new one.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from ashd.storage._models import Base

log = logging.getLogger(__name__)
_LOCK_ID = 0x61736864  # "ashd"


def _v1_initial(conn: Connection) -> None:
    Base.metadata.create_all(conn)
    conn.execute(
        text("INSERT INTO meta (name, value) VALUES ('api_key_hmac_secret', :v)"),
        {"v": secrets.token_hex(32)},
    )


def _add_column(conn: Connection, table: str, column: str, ddl: str) -> bool:
    """ALTER TABLE ADD COLUMN unless it is there: a fresh database got it from step 1's create_all,
    which builds the current models."""
    if column in {c["name"] for c in inspect(conn).get_columns(table)}:
        return False
    conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}"))
    return True


def _v2_model_calls(conn: Connection) -> None:
    """Model calls recorded by the model proxy, and their per-session sequence counter."""
    from ashd.storage._models import ModelCall

    ModelCall.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    _add_column(conn, "sessions", "next_model_call_seq", "BIGINT NOT NULL DEFAULT 0")


def _v3_storage_accounting(conn: Connection) -> None:
    """Per-session counts and bytes of stored messages and events, per-agent bytes of uploads."""
    added = [_add_column(conn, "sessions", name, "BIGINT NOT NULL DEFAULT 0")
             for name in ("message_count", "event_count", "stored_bytes")]
    _add_column(conn, "agents", "stored_bytes", "BIGINT NOT NULL DEFAULT 0")
    if not any(added):
        return
    # Existing rows: count what is there once. Byte lengths, not characters, on both databases.
    size = "octet_length({})" if conn.dialect.name == "postgresql" else "length(CAST({} AS BLOB))"
    sql = (
        "UPDATE sessions SET "
        "message_count = (SELECT count(*) FROM messages m WHERE m.session_id = sessions.id), "
        "event_count = (SELECT count(*) FROM session_events e WHERE e.session_id = sessions.id), "
        "stored_bytes = coalesce(SIZE(config), 0) "
        "+ coalesce((SELECT sum(SIZE(m.content)) FROM messages m WHERE m.session_id = sessions.id), 0) "
        "+ coalesce((SELECT sum(coalesce(SIZE(e.data), 0) + coalesce(SIZE(e.frame_data), 0)) "
        "FROM session_events e WHERE e.session_id = sessions.id), 0)"
    )
    # SIZE(x) stands for the dialect's byte length; nothing from outside reaches this statement.
    conn.execute(text(re.sub(r"SIZE\(([\w.]+)\)", lambda m: size.format(m.group(1)), sql)))


def _v4_turn_open(conn: Connection) -> None:
    _add_column(conn, "sessions", "turn_open", "BOOLEAN NOT NULL DEFAULT FALSE")


def _v5_agent_disk_mb(conn: Connection) -> None:
    _add_column(conn, "agents", "disk_mb", "INTEGER")


def _v8_short_key_prefixes(conn: Connection) -> None:
    """Stored prefixes were the first 12 characters of a key, a short key whole. Keys ashd made
    (`ashd_` + 40 characters) keep 8; any other key keeps at most half of what is stored: its length
    is what was stored if under 12, and at least 12 otherwise."""
    conn.execute(text(
        "UPDATE api_keys SET key_prefix = CASE"
        " WHEN source <> 'env' AND length(key_prefix) = 12 AND substr(key_prefix, 1, 5) = 'ashd_'"
        " THEN substr(key_prefix, 1, 8)"
        " ELSE substr(key_prefix, 1, length(key_prefix) / 2) END"
    ))


def _v9_drop_sandboxes(conn: Connection) -> None:
    """The `sandboxes` table was never written: sandboxes never outlive the server, and what a killed
    one leaves behind is found on disk (`runtime._rescue_workspaces`)."""
    conn.execute(text("DROP TABLE IF EXISTS sandboxes"))


def _v10_agent_versions(conn: Connection) -> None:
    """Managed agents' folders in the database, so every process can build them (issue 11). Folders
    deployed before this are imported from the data dir at start (`Agents.import_local_folders`)."""
    from ashd.storage._models import AgentVersion

    AgentVersion.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]


def _v11_owners(conn: Connection) -> None:
    """sessions.owner_id: whose start-up sweep may pause a session; runners.dead_at: liveness."""
    _add_column(conn, "sessions", "owner_id", "VARCHAR(255)")
    ts = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    _add_column(conn, "runners", "dead_at", ts)


def _v12_session_logs(conn: Connection) -> None:
    """A session's log lines (setup output, sandbox stderr) and their per-session counter."""
    from ashd.storage._models import SessionLog

    SessionLog.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    _add_column(conn, "sessions", "next_log_seq", "BIGINT NOT NULL DEFAULT 0")


def _v13_queue_claims(conn: Connection) -> None:
    """Queue items: who runs a `processing` item and until when (its lease), and the turn's result."""
    _add_column(conn, "queue_items", "owner", "VARCHAR(255)")
    _add_column(conn, "queue_items", "lease_until", "TIMESTAMP WITH TIME ZONE"
                if conn.dialect.name == "postgresql" else "DATETIME")
    _add_column(conn, "queue_items", "result", "TEXT")


def _v14_attachment_content(conn: Connection) -> None:
    """Attachments keep their bytes in the database (any coordinator serves them), listed by session."""
    binary = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
    _add_column(conn, "attachments", "content", binary)
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_attachments_session ON attachments (session_id, created_at)"))


def _v15_webhooks(conn: Connection) -> None:
    """Webhooks of tenants and their delivery outbox."""
    from ashd.storage._models import Webhook, WebhookDelivery

    Webhook.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    WebhookDelivery.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]


def _v16_webhook_listening_since(conn: Connection) -> None:
    """webhooks.listening_since: a hook enabled again does not hear what happened while it was off."""
    ts = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    _add_column(conn, "webhooks", "listening_since", ts)



def _v17_usage_sums_index(conn: Connection) -> None:
    """An index that covers the usage sums: /api/usage/stats reads no table row per record."""
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_usage_sums ON usage_events "
                      "(tenant_id, event_type, created_at, agent_name, value)"))


MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "initial schema", _v1_initial),
    (2, "model calls", _v2_model_calls),
    (3, "storage accounting", _v3_storage_accounting),
    (4, "sessions.turn_open: turns cut short by a crash are recorded at the next start", _v4_turn_open),
    (5, "agents.disk_mb: per-agent sandbox disk size", _v5_agent_disk_mb),
    (8, "api key prefixes: at most 8 characters and half of a key", _v8_short_key_prefixes),
    (9, "drop the unused sandboxes table", _v9_drop_sandboxes),
    (10, "agent_versions: managed agent folders in the database", _v10_agent_versions),
    (11, "sessions.owner_id and runners.dead_at: owner-scoped start-up sweep, runner liveness", _v11_owners),
    (12, "session logs: setup output and sandbox stderr", _v12_session_logs),
    (13, "queue items: claim owner, lease and result", _v13_queue_claims),
    (14, "attachments.content: attachment bytes in the database", _v14_attachment_content),
    (15, "webhooks and their delivery outbox", _v15_webhooks),
    (16, "webhooks.listening_since: an event is heard by the hooks enabled when it happened",
     _v16_webhook_listening_since),
    (17, "usage_events: an index covering the usage sums", _v17_usage_sums_index),
]


def _run(conn: Connection) -> list[int]:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    conn.execute(text(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(255) NOT NULL)"
    ))
    done = {row[0] for row in conn.execute(text("SELECT version FROM schema_migrations"))}
    applied = []
    for version, name, step in MIGRATIONS:
        if version in done:
            continue
        step(conn)
        conn.execute(text("INSERT INTO schema_migrations (version, name) VALUES (:v, :n)"), {"v": version, "n": name})
        applied.append(version)
    return applied


async def migrate(engine: AsyncEngine) -> list[int]:
    async with engine.begin() as conn:
        applied = await conn.run_sync(_run)
    if applied:
        log.info("database migrated", extra={"applied": ",".join(map(str, applied))})
    return applied
