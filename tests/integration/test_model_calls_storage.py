"""Model call records in SQLite and PostgreSQL: migration 2 on an older database, per-session
sequences under concurrent writers (as with several servers), usage events, spend sums."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid

from sqlalchemy import text

from ashd.storage import Database, ModelCallRecord, Session
from ashd.storage._migrate import migrate
from ashd.storage._model_calls import list_model_calls, session_spend, store_model_calls, tenant_spend
from ashd.storage._sessions import Sessions
from ashd.storage._usage import UsageFilter, usage_stats

NOW = dt.datetime.now(dt.UTC)


def call(session_id: str, n: int, *, tenant: str = "t", at: dt.datetime = NOW) -> ModelCallRecord:
    return ModelCallRecord(str(uuid.uuid4()), session_id, tenant, "agent", "sb", "q", "messages",
                           "claude-opus-4-1", n % 2 == 0, 64000, 200, "ok", None, None, 100, 50, 5, 7, 0.25,
                           12.5, 3.0, at + dt.timedelta(microseconds=n), "host-1")


async def test_migration_2_upgrades_an_older_database(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        async with db.engine.begin() as conn:  # make it look like a database of schema version 1
            await conn.execute(text("DROP TABLE model_calls"))
            await conn.execute(text("ALTER TABLE sessions DROP COLUMN next_model_call_seq"))
            await conn.execute(text("DELETE FROM schema_migrations WHERE version = 2"))
        assert await migrate(db.engine) == [2]
        sessions = Sessions(db)
        sid = (await sessions.insert(Session(tenant_id="t", agent_name="a"))).id
        await store_model_calls(db, [call(sid, 1)])
        assert [c["sequence"] for c in await list_model_calls(db, "t", sid, 0, 10)] == [1]
    finally:
        await db.close()


async def test_sequences_usage_and_spend(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        a = (await sessions.insert(Session(tenant_id="t", agent_name="a"))).id
        b = (await sessions.insert(Session(tenant_id="t", agent_name="a"))).id
        # Several writers at once, each batch mixing both sessions (locks are taken in id order).
        batches = [[call(a, 10 * i + j) for j in range(5)] + [call(b, 10 * i + j) for j in range(5)]
                   for i in range(8)]
        await asyncio.gather(*(store_model_calls(db, batch) for batch in batches))
        for sid in (a, b):
            listed = await list_model_calls(db, "t", sid, 0, 1000)
            assert [c["sequence"] for c in listed] == list(range(1, 41))
        page = await list_model_calls(db, "t", a, 10, 3)
        assert [c["sequence"] for c in page] == [11, 12, 13]
        first = page[0]
        assert (first["model"], first["inputTokens"], first["outputTokens"], first["cacheCreationTokens"],
                first["cacheReadTokens"], first["costUsd"], first["status"], first["outcome"]) == \
            ("claude-opus-4-1", 100, 50, 5, 7, 0.25, 200, "ok")
        assert await list_model_calls(db, "other-tenant", a, 0, 10) == []
        stats = await usage_stats(db, "t", UsageFilter(session_id=a))
        assert (stats["totalInputTokens"], stats["totalOutputTokens"], stats["totalCacheCreationTokens"],
                stats["totalCacheReadTokens"]) == (4000, 2000, 200, 280)
        assert await session_spend(db, a) == 10.0
        assert await tenant_spend(db, "t", NOW - dt.timedelta(days=1)) == 20.0
        assert await tenant_spend(db, "t", NOW + dt.timedelta(days=1)) == 0.0
        # calls of a session row that is gone are still stored (and billed), with sequence 0
        await store_model_calls(db, [dataclasses.replace(call("gone", 99), tenant="t")])
        assert await tenant_spend(db, "t", NOW - dt.timedelta(days=1)) == 20.25
    finally:
        await db.close()
