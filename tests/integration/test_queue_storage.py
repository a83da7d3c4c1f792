"""Queue claims in the database (SQLite and PostgreSQL): one owner per item, leases that expire,
a lost claim that cannot finish the item, backoff, and a graceful release."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import pytest

from ashd.errors import BadRequest, NotFound
from ashd.storage import Backoff, Database, QueueItems


@pytest.fixture
async def items(db_url: str) -> AsyncIterator[QueueItems]:
    db = await Database.open(db_url)
    try:
        yield QueueItems(db)
    finally:
        await db.close()


async def test_claims_leases_and_outcomes(items: QueueItems) -> None:
    first = await items.add("t1", "agent", "one", None, 0, 1)
    second = await items.add("t1", "agent", "two", None, 5, 0)

    (a,) = await items.claim("server-a", 0.3, per_tenant=1, count=5)  # the bound: one of t1's at a time
    assert a.id == second["id"]  # priority first
    assert await items.claim("server-b", 0.3, per_tenant=1, count=5) == []
    (b,) = await items.claim("server-b", 30, per_tenant=2, count=5)
    assert b.id == first["id"]
    assert await items.claim("server-b", 30, per_tenant=5, count=5) == []  # nothing is claimed twice

    # server-a goes quiet: its lease runs out and the item is pending again, for anyone.
    assert await items.renew("server-b", {b.id, a.id}, 30) == 1  # only its own
    assert await items.renew("server-b", set(), 30) == 0
    await asyncio.sleep(0.4)
    assert await items.reclaim_expired() == 1
    assert (await items.get("t1", a.id))["status"] == "pending"
    (again,) = await items.claim("server-b", 30, per_tenant=5, count=5)
    assert again.id == a.id
    assert not await items.complete(a.id, "server-a", "late")  # a lost claim cannot finish the item
    assert await items.complete(a.id, "server-b", "done")
    done = await items.get("t1", a.id)
    assert done["status"] == "completed" and done["result"] == "done" and done["completedAt"]

    # A failed attempt with retries left waits its backoff; none left: failed.
    assert await items.attempt_failed(b.id, "server-b", "model said no", Backoff(60, 300)) == "pending"
    waiting = await items.get("t1", b.id)
    assert waiting["retryCount"] == 1 and waiting["error"] == "model said no"
    due = dt.datetime.fromisoformat(waiting["nextAttemptAt"].replace("Z", "+00:00"))
    assert 55 < (due - dt.datetime.now(dt.UTC)).total_seconds() <= 60
    assert await items.claim("server-b", 30, per_tenant=5, count=5) == []  # not due yet

    third = await items.add("t1", "agent", "three", None, 0, 0)
    (c,) = await items.claim("server-c", 30, per_tenant=5, count=5)
    assert await items.attempt_failed(c.id, "server-c", "broken", Backoff()) == "failed"
    assert (await items.get("t1", third["id"]))["status"] == "failed"

    # A server that stops hands its running items back.
    fourth = await items.add("t2", "agent", "four", None, 0, 0)
    (d,) = await items.claim("server-d", 30, per_tenant=5, count=5)
    assert d.id == fourth["id"] and await items.release("server-d") == 1
    assert (await items.get("t2", d.id))["status"] == "pending"
    assert await items.stats("t1") == {"pending": 1, "processing": 0, "completed": 1, "failed": 1, "cancelled": 0}
    assert (await items.stats(None))["pending"] == 2


async def test_cancel_and_tenants(items: QueueItems) -> None:
    item = await items.add("t1", "agent", "x", None, 0, 3)
    with pytest.raises(NotFound):
        await items.cancel("t2", item["id"])
    with pytest.raises(NotFound):
        await items.get("t2", item["id"])
    assert (await items.cancel("t1", item["id"]))["status"] == "cancelled"
    with pytest.raises(BadRequest, match="only pending items"):
        await items.cancel("t1", item["id"])
    assert await items.claim("s", 30, per_tenant=5, count=5) == []  # a cancelled item never runs


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(5, 300)
    assert [backoff.delay(n) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert Backoff(0.2, 1).delay(100) == 1
