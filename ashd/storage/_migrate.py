"""Schema migrations, run at every start.

A small ordered list instead of alembic: each step runs in its own transaction and is recorded in
`schema_migrations`; on PostgreSQL an advisory lock keeps several coordinators starting at once
from racing. Steps are append-only: never edit a released step, add a new one.
"""

from __future__ import annotations

import logging
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


def _v4_turn_open(conn: Connection) -> None:
    # A database created by step 1 from today's models has the column already.
    if "turn_open" in {c["name"] for c in inspect(conn).get_columns("sessions")}:
        return
    conn.execute(text("ALTER TABLE sessions ADD COLUMN turn_open BOOLEAN NOT NULL DEFAULT FALSE"))


MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "initial schema", _v1_initial),
    (4, "sessions.turn_open: turns cut short by a crash are recorded at the next start", _v4_turn_open),
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
