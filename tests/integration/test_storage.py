"""Storage against SQLite and PostgreSQL: migrations, atomic sequences, durability, transactions."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import func, inspect, select, text

from ashd.errors import NotFound
from ashd.storage import Database, Message, Session, allocate
from ashd.storage._migrate import MIGRATIONS, migrate
from ashd.storage._sessions import Sessions


async def test_migrations_are_idempotent_and_recorded(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        assert await migrate(db.engine) == []  # second run applies nothing
        async with db.read() as s:
            versions = (await s.execute(text("SELECT version FROM schema_migrations"))).scalars().all()
        assert sorted(versions) == [m[0] for m in MIGRATIONS]
        assert await db.meta("api_key_hmac_secret")
    finally:
        await db.close()


async def test_sequences_are_atomic_under_concurrency(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a"))

        async def writer(n: int) -> list[int]:
            got = []
            for _ in range(n):
                got.append(await sessions.add_user_message(row.id, "t", "hi"))
            return got

        results = await asyncio.gather(*(writer(15) for _ in range(12)))
        allocated = [seq for chunk in results for seq in chunk]
        assert len(allocated) == len(set(allocated)) == 180
        assert sorted(allocated) == list(range(1, 181))
        async with db.read() as s:
            count = (await s.execute(select(func.count()).select_from(Message))).scalar_one()
        assert count == 180
        blocks = await asyncio.gather(*(sessions.reserve_events(row.id, 10) for _ in range(10)))
        assert sorted(blocks) == list(range(1, 101, 10))
    finally:
        await db.close()


async def test_allocate_for_unknown_session_is_not_found(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        with pytest.raises(NotFound):
            async with db.tx() as s:
                await allocate(s, "no-such-session", "event")
    finally:
        await db.close()


async def test_data_survives_reopen_and_timestamps_are_utc(db_url: str) -> None:
    db = await Database.open(db_url)
    row = await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active"))
    await db.close()
    db = await Database.open(db_url)
    try:
        again = await Sessions(db).get("t", row.id)
        assert again.status == "active"
        assert again.created_at.tzinfo is not None
        assert abs((again.created_at - dt.datetime.now(dt.UTC)).total_seconds()) < 60
        with pytest.raises(NotFound):
            await Sessions(db).get("other-tenant", row.id)
    finally:
        await db.close()


async def test_failed_transaction_leaves_nothing(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a"))
        with pytest.raises(RuntimeError):
            async with db.tx() as s:
                await allocate(s, row.id, "message")
                s.add(Message(session_id=row.id, tenant_id="t", role="user", content="{}", sequence=1))
                await s.flush()
                raise RuntimeError("boom")
        async with db.read() as s:
            assert (await s.execute(select(func.count()).select_from(Message))).scalar_one() == 0
        assert await sessions.add_user_message(row.id, "t", "x") == 1  # the counter rolled back too
    finally:
        await db.close()


async def test_orphaned_sessions_paused_in_bulk(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        a = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        b = await sessions.insert(Session(tenant_id="t", agent_name="a", status="starting"))
        c = await sessions.insert(Session(tenant_id="t", agent_name="a", status="ended"))
        assert sorted(await sessions.pause_orphans()) == sorted([a.id, b.id])
        assert (await sessions.get("t", a.id)).status == "paused"
        assert (await sessions.get("t", c.id)).status == "ended"
        events = await sessions.events("t", a.id, 0, 10, "lifecycle")
        assert '"reason": "restart"' in events[-1]["data"]
    finally:
        await db.close()


async def test_migration_4_adds_turn_open_to_a_database_made_before_it(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        async with db.engine.begin() as conn:  # the schema as the releases before step 4 made it
            await conn.execute(text("ALTER TABLE sessions DROP COLUMN turn_open"))
            await conn.execute(text("DELETE FROM schema_migrations WHERE version = 4"))
        assert await migrate(db.engine) == [4]
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        assert row.turn_open is False
        await sessions.add_user_message(row.id, "t", "hello")
        assert (await sessions.get("t", row.id)).turn_open is True
    finally:
        await db.close()


async def test_migration_9_drops_the_sandboxes_table_of_a_database_made_before_it(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        async with db.engine.begin() as conn:  # the schema as the releases before step 9 made it
            await conn.execute(text("CREATE TABLE sandboxes (id VARCHAR(64) PRIMARY KEY, state VARCHAR(16))"))
            await conn.execute(text("DELETE FROM schema_migrations WHERE version = 9"))
        assert await migrate(db.engine) == [9]
        async with db.engine.connect() as conn:
            tables = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        assert "sandboxes" not in tables and "sessions" in tables
    finally:
        await db.close()


async def test_a_turn_left_open_by_a_dead_process_is_stored_as_interrupted(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        cut = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        idle = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        await sessions.add_user_message(cut.id, "t", "a prompt the process never answered")
        await sessions.pause_orphans()
        frames = await sessions.frames_after(cut.id, 0)
        assert [f.event for f in frames] == ["error", "done"]
        assert "interrupted" in frames[0].data and "server stopped" in frames[0].data
        events = await sessions.events("t", cut.id, 0, 10, None)
        assert [e["type"] for e in events] == ["error", "lifecycle"]  # the `done` frame's row is internal
        assert (await sessions.get("t", cut.id)).turn_open is False
        assert await sessions.frames_after(idle.id, 0) == []  # no turn was running there
    finally:
        await db.close()


async def test_messages_and_events_are_filtered_by_tenant_in_storage(db_url: str) -> None:
    # Defence in depth: storage checks the session's tenant in the same read (NotFound, a 404) and
    # filters each row by tenant again, so nothing of another tenant's is ever read.
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="acme", agent_name="a", status="active"))
        await sessions.add_user_message(row.id, "acme", "hello")
        await sessions.transition(row.id, "acme", "paused", "paused")
        assert ["hello" in m["content"] for m in await sessions.messages("acme", row.id, 0, 10)] == [True]
        assert len(await sessions.events("acme", row.id, 0, 10, None)) >= 1
        for read in (sessions.messages("globex", row.id, 0, 10), sessions.events("globex", row.id, 0, 10, None),
                     sessions.events("globex", row.id, 0, 10, "lifecycle")):
            with pytest.raises(NotFound):
                await read
    finally:
        await db.close()


async def test_an_open_read_neither_blocks_a_write_nor_sees_it(db_url: str) -> None:
    """A read takes no write lock (SQLite: BEGIN DEFERRED, not IMMEDIATE): a transition on the writer
    thread and a write on the loop both commit while a read is open, at once rather than after the
    busy timeout; on SQLite the open read keeps the snapshot it began with."""
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        async with db.read() as r:
            status = select(Session.status).where(Session.id == row.id)
            assert (await r.execute(status)).scalar_one() == "active"
            paused = await asyncio.wait_for(sessions.transition(row.id, "t", "paused", "paused"), 5)
            assert paused.status == "paused"
            async with asyncio.timeout(5):
                async with db.tx() as w:
                    await w.execute(text("UPDATE sessions SET error = 'x' WHERE id = :id"), {"id": row.id})
            if db.dialect == "sqlite":  # a snapshot (PostgreSQL reads committed rows, its default)
                assert (await r.execute(status)).scalar_one() == "active"
        assert (await sessions.get("t", row.id)).status == "paused"
    finally:
        await db.close()


async def test_a_turns_last_batch_stores_its_usage_in_the_same_transaction(db_url: str) -> None:
    from ashd.storage import TurnUsage, UsageFilter, usage_stats
    from ashd.storage._sessions import EventRecord

    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active"))
        await sessions.add_user_message(row.id, "t", "hi")
        first = await sessions.reserve_events(row.id, 2)
        done = [EventRecord(first, "text", {"text": "yo"}, "message", '{"text":"yo"}'),
                EventRecord(first + 1, "frame", None, "done", "{}")]
        usage = TurnUsage("a", {"tool_calls": 0.0, "message": 1.0, "compute_seconds": 0.25})
        with pytest.raises(NotFound):  # a batch that cannot be stored stores no usage either
            await sessions.store_turn_batch("no-such-session", "t", [("assistant", '"x"')], done, usage)
        assert not any((await usage_stats(db, "t", UsageFilter())).values())
        await sessions.store_turn_batch(row.id, "t", [("assistant", '"x"')], done, usage)
        stats = await usage_stats(db, "t", UsageFilter(session_id=row.id))
        assert stats["totalMessages"] == 1 and stats["totalComputeSeconds"] == 0.25 and stats["totalToolCalls"] == 0
        stored = await sessions.get("t", row.id)
        assert stored.turn_open is False and stored.message_count == 2
        assert [f.event for f in await sessions.frames_after(row.id, 0)] == ["message", "done"]
    finally:
        await db.close()
