"""Model call records in SQLite and PostgreSQL: migration 2 on an older database, per-session
sequences under concurrent writers (as with several servers), usage events, spend sums, and a
turn's calls stored with its end."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import uuid

import pytest
from sqlalchemy import text

from ashd.actors._turn import TurnLimits, TurnRecorder
from ashd.errors import NotFound
from ashd.storage import Database, ModelCallRecord, Session
from ashd.storage._migrate import migrate
from ashd.storage._model_calls import list_model_calls, session_spend, store_model_calls, tenant_spend
from ashd.storage._sessions import EventRecord, Sessions
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


async def test_a_turn_stores_its_calls_in_its_last_batch(db_url: str) -> None:
    """The calls given to the batch with `done` get the session's next sequences, their usage events,
    and are counted in the row the batch returns; a batch that fails stores none of them."""
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        sid = (await sessions.insert(Session(tenant_id="t", agent_name="a"))).id
        await store_model_calls(db, [call(sid, 1)])  # one stored by the proxy's writer before
        done = EventRecord(1, "frame", None, "done", "{}")
        row = await sessions.store_turn_batch(sid, "t", [], [done], calls=[call(sid, 2), call(sid, 3)])
        assert row is not None and row.next_model_call_seq == 3
        assert [c["sequence"] for c in await list_model_calls(db, "t", sid, 0, 10)] == [1, 2, 3]
        assert await session_spend(db, sid) == 0.75
        stats = await usage_stats(db, "t", UsageFilter(session_id=sid))
        assert stats["totalInputTokens"] == 300
        with pytest.raises(NotFound):  # a message for a session that is gone: the whole batch fails
            await sessions.store_turn_batch("gone", "t", [("assistant", "{}")], [], calls=[call("gone", 4)])
        assert await tenant_spend(db, "t", NOW - dt.timedelta(days=1)) == 0.75
    finally:
        await db.close()


async def test_the_calls_of_a_turn_whose_end_was_not_stored_are_given_back(db_url: str) -> None:
    """`TurnRecorder.done` with calls, for a session whose row went meanwhile: the batch fails, and
    the calls come back from `unstored_calls` for their writer, which stores them on their own."""
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        sid = (await sessions.insert(Session(tenant_id="t", agent_name="a"))).id
        recorder = TurnRecorder(sessions, sid, "t", TurnLimits(max_bytes=1 << 30, max_events=100, retry_seconds=0.2))
        await recorder.message({"type": "assistant", "message": {"content": [{"type": "text", "text": "hi"}]}},
                               json.dumps({"type": "assistant"}))
        async with db.tx() as s:
            await s.execute(text("DELETE FROM sessions WHERE id = :id"), {"id": sid})
        calls = [call(sid, 1), call(sid, 2)]
        with pytest.raises(NotFound):
            await recorder.done(None, calls)
        assert await tenant_spend(db, "t", NOW - dt.timedelta(days=1)) == 0.0  # nothing of the batch
        back = recorder.unstored_calls()
        assert [c.id for c in back] == [c.id for c in calls] and recorder.unstored_calls() == []
        await store_model_calls(db, back)  # as the proxy's writer does with them
        assert await tenant_spend(db, "t", NOW - dt.timedelta(days=1)) == 0.5
    finally:
        await db.close()
