"""Database failures become ApiErrors a person can act on: a full disk on PostgreSQL (SQLSTATE 53100,
raised by a real server) is 507, an unreachable database is 503; and migration 3 counts the history
that was stored before it (both databases)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from ashd.actors._turn import TurnLimitReached, TurnLimits, TurnRecorder
from ashd.errors import DatabaseUnavailable, StorageFull
from ashd.storage import Database, Message, Session, SessionEvent
from ashd.storage._migrate import migrate
from ashd.storage._sessions import EventRecord, Sessions
from tests.fixtures.databases import fresh_postgres

DISK_FULL = ("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'disk_full', "
             "MESSAGE = 'could not extend file: No space left on device'; END $$")


async def test_postgres_disk_full_is_507() -> None:
    async for url in fresh_postgres():
        db = await Database.open(url)
        try:
            with pytest.raises(StorageFull) as caught:
                await db.run_tx(lambda s: s.execute(text(DISK_FULL)))
            assert caught.value.status_code == 507 and "data disk is full" in caught.value.message
            with pytest.raises(StorageFull):
                async with db.tx() as s:
                    await s.execute(text(DISK_FULL))
            async with db.read() as s:  # and the database goes on
                assert (await s.execute(text("SELECT 1"))).scalar_one() == 1
        finally:
            await db.close()


async def test_an_unreachable_database_is_503() -> None:
    from ashd.storage._engine import create_engine

    # Built without `Database.open`, which would migrate: nothing connects until the read.
    db = Database(create_engine("postgresql://postgres@127.0.0.1:9/nowhere"))  # port 9: nothing listens
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            async with db.read() as s:
                await s.execute(text("SELECT 1"))
        assert caught.value.status_code == 503 and "unreachable" in caught.value.message
    finally:
        await db.engine.dispose()


async def test_migration_3_counts_history_stored_before_it(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        await sessions.insert(Session(id="00000000-0000-0000-0000-000000000001", tenant_id="t", agent_name="a",
                                      config='{"systemPrompt": "é"}'))
        sid = "00000000-0000-0000-0000-000000000001"
        await sessions.add_user_message(sid, "t", "héllo")
        first = await sessions.reserve_events(sid, 2)
        await sessions.store_turn_batch(sid, "t", [("assistant", '{"type":"assistant","x":"ü"}')],
                                        [EventRecord(first, "text", {"text": "ü"}, "message", '{"a":"ü"}'),
                                         EventRecord(first + 1, "frame", None, "done", '{"sessionId":"x"}')])
        async with db.read() as s:
            counted = (await s.execute(text(
                "SELECT message_count, event_count, stored_bytes FROM sessions WHERE id = :i"), {"i": sid})).one()
            rows = (await s.execute(text("SELECT count(*) FROM session_events"))).scalar_one()
        assert counted[0] == 2 and counted[1] == rows == 2

        # The database as it was before migration 3: no counters, step 3 not recorded.
        async with db.engine.begin() as conn:
            for column in ("message_count", "event_count", "stored_bytes"):
                await conn.execute(text(f"ALTER TABLE sessions DROP COLUMN {column}"))
            await conn.execute(text("ALTER TABLE agents DROP COLUMN stored_bytes"))
            await conn.execute(text("DELETE FROM schema_migrations WHERE version = 3"))
        assert await migrate(db.engine) == [3]
        async with db.read() as s:
            again = (await s.execute(text(
                "SELECT message_count, event_count, stored_bytes FROM sessions WHERE id = :i"), {"i": sid})).one()
        assert tuple(again) == tuple(counted)  # the same numbers the writers keep, in bytes not characters
        assert Message.__tablename__ and SessionEvent.__tablename__  # the tables the counters describe
    finally:
        await db.close()


async def test_bridge_errors_count_against_the_turn_bounds(tmp_path: Path) -> None:
    """A sandbox that sends `error` frames without end is stopped like one that sends messages."""
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}")
    try:
        sessions = Sessions(db)
        sid = "00000000-0000-0000-0000-000000000002"
        await sessions.insert(Session(id=sid, tenant_id="t", agent_name="a"))
        recorder = TurnRecorder(sessions, sid, "t", TurnLimits(max_bytes=1 << 30, max_events=10))
        for _ in range(10):
            await recorder.error("agent says no", counted=True)
        with pytest.raises(TurnLimitReached) as caught:
            await recorder.error("agent says no", counted=True)
        assert "SERVICE_TURN_MAX_EVENTS" in caught.value.message
        await recorder.error(caught.value.message)  # the server's own reason is always stored
        done = await recorder.done()
        assert done.sequence is not None and done.unstored == ()
        async with db.read() as s:
            stored = (await s.execute(text("SELECT count(*) FROM session_events WHERE type = 'error'"))).scalar_one()
        assert stored == 11
    finally:
        await db.close()
