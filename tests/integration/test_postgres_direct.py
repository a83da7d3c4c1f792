"""PostgreSQL's direct path (`_fastpath_pg.py`) and the pool's idle ping (`_engine.py`) on a real
server: a connection the database dropped is replaced before anything is written, a failed or
cancelled transaction leaves nothing stored and no connection in an unknown state, and the rows a
transaction answers are those an ORM read finds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, func, select, text

from ashd.errors import DatabaseUnavailable, NotFound
from ashd.storage import Database, Session, SessionEvent
from ashd.storage import _engine as engine_module
from ashd.storage._direct import Statements
from ashd.storage._models import Agent, Message
from ashd.storage._sessions import _INSERT_EVENT, Sessions
from tests.fixtures.databases import fresh_postgres


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async for url in fresh_postgres():
        yield url


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[Database]:
    database = await Database.open(pg_url)
    try:
        yield database
    finally:
        await database.close()


async def _seeded(db: Database) -> Session:
    async with db.tx() as s:
        s.add(Agent(tenant_id="t", name="a", path="/agents/a"))
    return await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active"))


async def _drop_connections(pg_url: str) -> int:
    """Terminate every other backend of the test's database, as a restart of the server would, and
    wait until each is gone; then let this loop read their goodbyes, as it would during a restart
    (which takes longer than a loop iteration)."""
    conn = await asyncpg.connect(pg_url)
    try:
        dropped = int(await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    finally:
        await conn.close()
    await asyncio.sleep(0.1)
    return dropped


async def _events(db: Database, session_id: str) -> list[dict[str, Any]]:
    async with db.read() as s:
        rows = (await s.execute(select(SessionEvent.data).where(SessionEvent.session_id == session_id)
                                .order_by(SessionEvent.sequence))).scalars().all()
    return [json.loads(r or "null") for r in rows]


async def test_a_transition_after_the_database_dropped_its_connections_is_stored_once(
        db: Database, pg_url: str) -> None:
    row = await _seeded(db)
    sessions = Sessions(db)
    await sessions.transition(row.id, "t", "paused", "paused")
    assert await _drop_connections(pg_url) >= 1  # the pool's connection, used a moment ago: no ping
    paused = await sessions.transition(row.id, "t", "active", "resumed")
    assert paused.status == "active"
    assert [e["action"] for e in await _events(db, row.id)] == ["paused", "resumed"]
    await _drop_connections(pg_url)  # and a transaction of several statements: its BEGIN fails first
    other = await sessions.insert(Session(tenant_id="t", agent_name="a", status="starting"))
    assert (await sessions.get("t", other.id)).status == "starting"


async def test_a_write_cut_off_after_it_was_sent_is_not_tried_again(db: Database, pg_url: str) -> None:
    await _seeded(db)
    calls: list[int] = []

    def write(x: Statements) -> None:
        calls.append(1)
        x.rows(select(func.pg_sleep(5)), {})  # stands for a write whose outcome the cut leaves unknown

    task = asyncio.create_task(db.run_direct(write, one_write=True))
    while not calls:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    await _drop_connections(pg_url)
    with pytest.raises(DatabaseUnavailable):
        await task
    assert calls == [1]


async def test_a_read_after_the_database_dropped_its_connections_is_answered(db: Database, pg_url: str) -> None:
    row = await _seeded(db)
    await _drop_connections(pg_url)
    rows = await db.read_rows(select(Session.id).where(Session.id == row.id), {})
    assert rows == [{"id": row.id}]


async def test_an_idle_connection_is_pinged_and_replaced_before_an_orm_session_uses_it(
        db: Database, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row = await _seeded(db)
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.0)
    await _drop_connections(pg_url)
    async with db.read() as s:
        assert (await s.execute(select(Session.status).where(Session.id == row.id))).scalar_one() == "active"
    async with db.tx() as s:
        await s.execute(text("SELECT 1"))


def _invalidations(db: Database) -> list[object]:
    seen: list[object] = []
    event.listen(db.engine.sync_engine, "invalidate", lambda *args: seen.append(args))
    return seen


async def test_a_transaction_that_fails_stores_nothing_and_its_connection_goes_on(db: Database) -> None:
    row = await _seeded(db)
    invalidated = _invalidations(db)
    with pytest.raises(NotFound):  # refused by the transaction function itself
        await Sessions(db).transition("no-such-session", "t", "paused", "paused")

    def half(x: Statements) -> None:
        x.run(_INSERT_EVENT, {"id": "e1", "session_id": row.id, "tenant_id": "t", "type": "lifecycle",
                              "data": "{}", "sequence": 99, "created_at": row.created_at})
        raise RuntimeError("changed its mind")

    with pytest.raises(RuntimeError, match="changed its mind"):
        await db.run_direct(half)

    def duplicate(x: Statements) -> None:  # the database refuses it: a statement's own error
        for _ in range(2):
            x.run(_INSERT_EVENT, {"id": "e2", "session_id": row.id, "tenant_id": "t", "type": "lifecycle",
                                  "data": "{}", "sequence": 98, "created_at": row.created_at})

    with pytest.raises(asyncpg.UniqueViolationError):
        await db.run_direct(duplicate)
    assert await _events(db, row.id) == []
    assert (await Sessions(db).transition(row.id, "t", "paused", "paused")).status == "paused"
    assert db.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert invalidated == []  # each failure ended its transaction cleanly: no connection was dropped


async def test_a_cancelled_transaction_stores_nothing_and_leaves_no_connection_behind(db: Database) -> None:
    row = await _seeded(db)
    started = asyncio.Event()

    def slow(x: Statements) -> None:
        x.run(_INSERT_EVENT, {"id": "e3", "session_id": row.id, "tenant_id": "t", "type": "lifecycle",
                              "data": "{}", "sequence": 97, "created_at": row.created_at})
        started.set()
        x.rows(select(func.pg_sleep(30)), {})

    task = asyncio.create_task(db.run_direct(slow))
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _events(db, row.id) == []
    assert db.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    for _ in range(3):  # more than the connections that were in use: each one handed out works
        assert (await Sessions(db).transition(row.id, "t", "paused", "paused")).status == "paused"
    assert [e["action"] for e in await _events(db, row.id)] == ["paused"] * 3


async def test_the_direct_path_answers_the_rows_an_orm_read_finds(db: Database) -> None:
    row = await _seeded(db)
    changed = await Sessions(db).transition(row.id, "t", "paused", "paused", extra={"reason": "x"},
                                            sandbox_id="sb-1", error=None)
    async with db.read() as s:
        stored = (await s.execute(select(Session).where(Session.id == row.id))).scalar_one()
    for column in Session.__table__.columns:
        assert getattr(changed, column.key) == getattr(stored, column.key), column.key
    assert changed.updated_at.tzinfo is not None
    rows = await db.read_rows(select(Session.id, Session.updated_at).where(Session.id == row.id), {})
    assert rows == [{"id": row.id, "updated_at": stored.updated_at}]


async def test_a_one_statement_write_whose_insert_fails_changes_nothing(db: Database) -> None:
    """A transition and a prompt are one statement each on PostgreSQL (an UPDATE and an INSERT in
    one CTE, run without a transaction around it): when the INSERT is refused, so is the UPDATE."""
    row = await _seeded(db)
    sessions = Sessions(db)
    taken = {"session_id": row.id, "tenant_id": "t", "created_at": row.created_at}
    async with db.tx() as s:  # the sequences the next event and the next message would get
        s.add(SessionEvent(id="held-e", type="lifecycle", data="{}", sequence=row.next_event_seq + 1, **taken))
        s.add(Message(id="held-m", role="user", content="{}", sequence=row.next_message_seq + 1, **taken))
    with pytest.raises(asyncpg.UniqueViolationError):
        await sessions.transition(row.id, "t", "paused", "paused")
    with pytest.raises(asyncpg.UniqueViolationError):
        await sessions.add_user_message(row.id, "t", "hi")
    after = await sessions.get("t", row.id)
    assert (after.status, after.next_event_seq, after.event_count) == ("active", row.next_event_seq, row.event_count)
    assert (after.next_message_seq, after.message_count, after.turn_open) == (
        row.next_message_seq, row.message_count, row.turn_open)
    assert after.stored_bytes == row.stored_bytes
