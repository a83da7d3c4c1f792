"""Migration 17: a database made before it gets the index that covers the usage sums, and
/api/usage/stats's sums, read through it, are the records' sums for every filter, on SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from sqlalchemy import column, delete, inspect, table, text

from ashd.storage import Database, UsageFilter, usage_stats
from ashd.storage._migrate import migrate
from ashd.storage._models import new_id
from ashd.storage._usage import EVENT_TYPES, INSERT_USAGE, STAT_FIELDS

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


async def test_the_usage_sums_index_is_made_by_migration_17_and_the_sums_match_the_records(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        async with db.engine.begin() as conn:  # the table as it was before 17
            await conn.execute(text("DROP INDEX ix_usage_sums"))
            migrations = table("schema_migrations", column("version"))
            await conn.execute(delete(migrations).where(migrations.c.version == 17))
        assert await migrate(db.engine) == [17]
        async with db.engine.connect() as conn:
            indexes = await conn.run_sync(lambda c: {ix["name"] for ix in inspect(c).get_indexes("usage_events")})
        assert "ix_usage_sums" in indexes

        rng = random.Random(7)
        rows: list[dict[str, Any]] = [{"id": new_id(), "tenant_id": rng.choice(["t", "u"]), "session_id": rng.choice(["s1", "s2", "s3"]),
                 "agent_name": rng.choice(["a", "b"]), "event_type": rng.choice([*EVENT_TYPES, "cost_usd"]),
                 "value": float(rng.randint(1, 500)) if rng.random() < 0.8 else rng.random(),
                 "created_at": T0 + dt.timedelta(minutes=rng.randint(0, 5000))} for _ in range(600)]
        await db.run_direct(lambda x: x.run_many(INSERT_USAGE, rows))
        if db.engine.dialect.name == "sqlite":
            async with db.engine.connect() as conn:
                plan = (await conn.execute(text(
                    "EXPLAIN QUERY PLAN SELECT event_type, sum(value) FROM usage_events WHERE tenant_id = 't' "
                    "AND event_type IN ('message', 'tool_calls') GROUP BY event_type"))).all()
            assert any("COVERING INDEX ix_usage_sums" in str(step) for step in plan), plan

        mid, late = T0 + dt.timedelta(minutes=1200), T0 + dt.timedelta(minutes=3900)
        for flt in (UsageFilter(), UsageFilter(agent_name="a"), UsageFilter(session_id="s2"),
                    UsageFilter(after=mid), UsageFilter(before=late), UsageFilter(agent_name="b", after=mid, before=late),
                    UsageFilter(after=rows[0]["created_at"], before=rows[0]["created_at"])):
            expected = dict.fromkeys(STAT_FIELDS.values(), 0.0)
            for r in rows:
                if (r["tenant_id"] == "t" and r["event_type"] in STAT_FIELDS
                        and flt.agent_name in (None, r["agent_name"]) and flt.session_id in (None, r["session_id"])
                        and (flt.after is None or r["created_at"] > flt.after)
                        and (flt.before is None or r["created_at"] < flt.before)):
                    expected[STAT_FIELDS[r["event_type"]]] += r["value"]
            got = await usage_stats(db, "t", flt)
            assert got.keys() == expected.keys()
            for name, value in expected.items():
                assert abs(got[name] - value) < 1e-6, (flt, name, got[name], value)
    finally:
        await db.close()
