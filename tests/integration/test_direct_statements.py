"""Transitions on prebuilt statements: the driver path (SQLite) and the Core path (PostgreSQL) store
and answer the same; an actor's inline transaction never waits behind a stalled database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, insert, select

from ashd.errors import NotFound
from ashd.storage import Database, Session, SessionEvent
from ashd.storage._database import INLINE_WAIT_MS
from ashd.storage._direct import SqliteStatements, Statements
from ashd.storage._models import Agent
from ashd.storage._sessions import SessionHeldElsewhere, Sessions

COLUMNS = [c.key for c in Session.__table__.columns]


def _columns(row: Session) -> dict[str, Any]:
    return {name: getattr(row, name) for name in COLUMNS}


async def _seeded(db: Database, **values: Any) -> Session:
    async with db.tx() as s:
        s.add(Agent(tenant_id="t", name="a", path="/agents/a"))
    return await Sessions(db).insert(Session(tenant_id="t", agent_name="a", status="active",
                                             env_ciphertext=b"\x00secret\xff", **values))


class _RecordedLock:
    """The writer's lock, recording how long each `acquire` was willing to wait."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.timeouts: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.timeouts.append(timeout)
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: Any) -> None:
        self.release()


@contextlib.asynccontextmanager
async def _with_another_connection(tmp_path: Path) -> AsyncIterator[tuple[Sessions, Session, sqlite3.Connection]]:
    """A seeded SQLite database and a second connection to it, as an operator's `sqlite3` shell."""
    path = tmp_path / "ashd.db"
    db = await Database.open(f"sqlite+aiosqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        yield Sessions(db), await _seeded(db), other
    finally:
        other.close()
        await db.close()


async def _events(db: Database, session_id: str) -> list[str | None]:
    async with db.read() as s:
        return list((await s.execute(select(SessionEvent.data).where(SessionEvent.session_id == session_id)
                                     .order_by(SessionEvent.sequence))).scalars())


async def test_a_transition_answers_the_row_as_storage_reads_it(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await _seeded(db, runner_id="r1", turn_open=True)
        paused = await sessions.transition(row.id, "t", "paused", "paused", extra={"reason": "test"}, fence="r1",
                                           sandbox_id="sb-1", error=None)
        stored = await sessions.get("t", row.id)
        assert _columns(paused) == _columns(stored)
        assert paused.status == "paused" and paused.sandbox_id == "sb-1" and paused.turn_open is True
        assert paused.env_ciphertext == b"\x00secret\xff"
        assert paused.updated_at.tzinfo is not None and paused.updated_at >= row.created_at
        assert paused.next_event_seq == row.next_event_seq + 1 and paused.event_count == row.event_count + 1
        assert await _events(db, row.id) == ['{"action": "paused", "status": "paused", "reason": "test"}']

        # From an actor's thread: on SQLite run there and then, elsewhere a coroutine for the loop.
        started = sessions.transition_soon(row.id, "t", "active", "resumed", agent="a")
        resumed = started.result(5) if not asyncio.iscoroutine(started) else await started  # type: ignore[union-attr]
        assert _columns(resumed) == _columns(await sessions.get("t", row.id))
        assert resumed.status == "active"
    finally:
        await db.close()


async def test_a_refused_transition_writes_nothing(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db)
        row = await _seeded(db, runner_id="r1")
        with pytest.raises(NotFound, match="Agent gone not found"):
            await sessions.transition(row.id, "t", "active", "resumed", agent="gone")
        with pytest.raises(SessionHeldElsewhere, match="runner r1"):
            await sessions.transition(row.id, "t", "paused", "paused", fence="r2")  # r1 holds it live
        with pytest.raises(NotFound, match="Session nope not found"):
            await sessions.transition("nope", "t", "paused", "paused")
        assert _columns(await sessions.get("t", row.id)) == _columns(row)
        assert await _events(db, row.id) == []
        # Not live any more: another runner may write it (a coordinator's sweep pauses it, say).
        await sessions.transition(row.id, "t", "paused", "paused")
        assert (await sessions.transition(row.id, "t", "active", "resumed", fence="r2")).status == "active"
    finally:
        await db.close()


async def test_an_inline_transition_goes_to_the_writer_thread_while_another_process_holds_the_database(
        tmp_path: Path) -> None:
    """An operator's `sqlite3` shell (another connection) holds SQLite's write lock: the actor's thread
    is given back at once with a future the writer thread resolves once the lock is free."""
    async with _with_another_connection(tmp_path) as (sessions, row, other):
        other.execute("BEGIN IMMEDIATE")
        future = await asyncio.to_thread(sessions.transition_soon, row.id, "t", "paused", "paused")
        assert not future.done()  # type: ignore[union-attr]
        other.execute("COMMIT")
        paused = await asyncio.wrap_future(future)  # type: ignore[arg-type]
        assert paused.status == "paused" == (await sessions.get("t", row.id)).status


async def test_a_transition_on_the_loop_does_not_wait_for_the_database(tmp_path: Path) -> None:
    """A request handled on the loop's thread (`actors/_inline.py`) runs its transition there only
    if the database is free at once: with another connection holding the write lock, and with the
    writer's own lock held by another thread, the loop is given back a future at once, with no busy
    wait (an actor's thread would wait up to INLINE_WAIT_MS), and the writer thread stores it."""
    async with _with_another_connection(tmp_path) as (sessions, row, other):
        other.execute("BEGIN IMMEDIATE")
        future = sessions.transition_soon(row.id, "t", "paused", "paused")  # on the loop's thread
        assert isinstance(future, concurrent.futures.Future) and not future.done()
        writer = sessions.db._writer
        assert writer is not None
        other.execute("COMMIT")
        assert (await asyncio.wrap_future(future)).status == "paused"

        held, release = threading.Event(), threading.Event()
        waits = _RecordedLock(writer._lock)
        writer._lock = waits  # type: ignore[assignment]

        def hold_the_writer() -> None:
            with waits:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold_the_writer)
        holder.start()
        held.wait(10)
        asked = len(waits.timeouts)  # the writer thread's own acquire, which waits, may follow the loop's
        future = sessions.transition_soon(row.id, "t", "active", "resumed")
        assert isinstance(future, concurrent.futures.Future) and not future.done()
        assert waits.timeouts[asked] == 0  # the loop's attempt did not wait for the lock
        release.set()
        holder.join(10)
        assert (await asyncio.wrap_future(future)).status == "active"
        asked = len(waits.timeouts)
        await asyncio.to_thread(lambda: sessions.transition_soon(row.id, "t", "paused", "paused").result(10))  # type: ignore[union-attr]
        assert waits.timeouts[asked] == INLINE_WAIT_MS / 1000  # an actor's thread waits a little
        actions = [json.loads(data or "{}")["action"] for data in await _events(sessions.db, row.id)]
        assert actions[-3:] == ["paused", "resumed", "paused"]


async def test_an_inline_transaction_that_fails_leaves_nothing_and_the_next_works(tmp_path: Path) -> None:
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}")
    try:
        row = await _seeded(db)
        events = insert(SessionEvent)

        def half_then_fail(x: Any) -> None:
            x.run(events, {"id": "e1", "session_id": row.id, "tenant_id": "t", "type": "lifecycle", "data": "{}",
                           "sequence": 1, "created_at": dt.datetime.now(dt.UTC)})
            raise RuntimeError("in the middle")

        failed = db.direct_here(half_then_fail)
        assert failed is not None and isinstance(failed.exception(), RuntimeError)
        assert await _events(db, row.id) == []  # rolled back
        done = db.direct_here(lambda x: x.rows(select(Session.__table__.c.status).where(
            Session.__table__.c.id == row.id), {}))
        assert done is not None and done.result() == [{"status": "active"}]
    finally:
        await db.close()


async def test_the_writer_thread_and_an_inline_transaction_take_turns(tmp_path: Path) -> None:
    """Transitions from several threads beside the writer thread's own transactions: each one
    stored once, the event sequence unbroken."""
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}")
    try:
        sessions = Sessions(db)
        row = await _seeded(db)

        def flip(n: int) -> None:
            for i in range(n):
                status = "paused" if i % 2 == 0 else "active"
                future = sessions.transition_soon(row.id, "t", status, status)
                future.result(30)  # type: ignore[union-attr]

        threads = [threading.Thread(target=flip, args=(25,)) for _ in range(3)]
        for t in threads:
            t.start()
        for _ in range(25):
            await sessions.add_user_message(row.id, "t", "hi")  # on the writer thread
        for t in threads:
            await asyncio.to_thread(t.join)
        stored = await sessions.get("t", row.id)
        assert stored.event_count == 75 and stored.message_count == 25
        async with db.read() as s:
            sequences = list((await s.execute(select(SessionEvent.sequence).where(
                SessionEvent.session_id == row.id).order_by(SessionEvent.sequence))).scalars())
        assert sequences == list(range(sequences[0], sequences[0] + 75))
    finally:
        await db.close()


def test_a_statement_that_needs_more_than_its_values_is_refused(tmp_path: Path) -> None:
    raw = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    try:
        x = SqliteStatements(raw)
        # Session's id and timestamps have Python-side defaults, which the driver path would leave out.
        with pytest.raises(ValueError, match="Python-side column defaults"):
            x.run(insert(Session), {"tenant_id": "t", "agent_name": "a"})
        with pytest.raises(KeyError):
            x.rows(select(Session.__table__.c.status).where(Session.__table__.c.id == bindparam("_id")), {})
    finally:
        raw.close()


async def test_run_many_stores_each_row_as_run_does(db_url: str) -> None:
    """One batch of the driver's (`executemany`), the rows converted as one `run` each would be; rows
    whose keys differ from the first's are refused before anything runs."""
    db = await Database.open(db_url)
    try:
        seeded = await _seeded(db)
        at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
        rows = [{"id": f"e{i}", "session_id": seeded.id, "tenant_id": "t", "type": "lifecycle",
                 "data": json.dumps({"i": i}), "sequence": 100 + i, "created_at": at} for i in range(3)]
        await db.run_direct(lambda x: x.run_many(insert(SessionEvent), rows))
        bad: list[dict[str, Any]] = [rows[0] | {"id": "e9", "sequence": 109}, {"id": "e10", "session_id": seeded.id}]

        def one_then_bad(x: Statements) -> None:
            x.run(insert(SessionEvent), rows[0] | {"id": "e8", "sequence": 108})
            x.run_many(insert(SessionEvent), bad)

        with pytest.raises(ValueError, match="every row needs the keys"):
            await db.run_direct(one_then_bad)
        await db.run_direct(lambda x: x.run_many(insert(SessionEvent), []))
        async with db.read() as s:
            stored = (await s.execute(select(SessionEvent).where(SessionEvent.sequence >= 100)
                                      .order_by(SessionEvent.sequence))).scalars().all()
        assert [(e.id, e.sequence, json.loads(e.data or "")) for e in stored] == \
            [("e0", 100, {"i": 0}), ("e1", 101, {"i": 1}), ("e2", 102, {"i": 2})]  # e8: rolled back
        assert stored[0].created_at == at
    finally:
        await db.close()


async def test_an_inserted_session_is_answered_as_storage_reads_it(db_url: str) -> None:
    """The insert fills in what the model's defaults give (id, timestamps, counters) and nulls, as a
    flush would: the answer is the stored row, column for column."""
    db = await Database.open(db_url)
    try:
        sessions = Sessions(db, owner_id="server-1")
        inserted = await sessions.insert(Session(tenant_id="t", agent_name="a", config='{"k": "v"}',
                                                 env_ciphertext=b"\x01"))
        stored = await sessions.get("t", inserted.id)
        assert _columns(inserted) == _columns(stored)
        assert inserted.status == "starting" and inserted.turn_open is False and inserted.model is None
        assert inserted.owner_id == "server-1" and inserted.stored_bytes == len('{"k": "v"}')
        assert inserted.created_at.tzinfo is not None and len(inserted.id) == 36
    finally:
        await db.close()
