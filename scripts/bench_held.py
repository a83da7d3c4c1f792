#!/usr/bin/env python3
"""The speed table on a database that has been in use: the same rows on a server whose tenant has
`--held` ended sessions stored (each with the messages, events, model calls and usage records of a
real turn), beside a server on an empty database, interleaved round by round.

    .venv/bin/python scripts/bench_held.py [--held 20000] [--n 30] [--postgres URL]

The held sessions are copies of one real session (created, two turns run, deleted) made in SQL
while the server is stopped, half for the bench's tenant and half for another tenant; the server is
then started again on that database, and the time it takes to answer `/health` is printed; the
empty server is made the same way with no copies. Each
round then runs the table's rows (`bench_sessions.table_round`) on both servers, and the reads a
client or an operator makes of what is stored: the tenant's session list, its storage, an old
session, its messages, its usage sums. A row whose cost grows with what is stored shows as a ratio
well above 1 (docs/performance.md, thirty-seventh pass).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from ashd.storage._models import Base

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sessions as bs
from bench_sessions import TABLE, Client, ashd_server, fake_model, script_instant, table_round, timed

# What a held session has, besides its row, copied with it: every table keyed by a session.
CHILDREN = ("messages", "session_events", "model_calls", "usage_events", "session_logs")
TIMES = ("created_at", "last_active_at", "updated_at")
OTHER_TENANT = "bench-other-tenant"
READS = ("list the tenant's sessions", "GET /api/storage", "GET an old session", "an old session's messages",
         "GET /api/usage/stats")


def _new_id(dialect: str) -> str:
    """A 36-character id from the copy's number `i` and tenant number `k`; its first 24 characters
    prefix its rows' ids (the template's ids' last 12 keep them apart)."""
    if dialect == "sqlite":
        return "printf('%08x-%04x-4000-8000-000000000000', i, k)"
    return "lpad(to_hex(i), 8, '0') || '-' || lpad(to_hex(k), 4, '0') || '-4000-8000-000000000000'"


def _copy_statements(dialect: str, template: str) -> list[str]:
    """INSERT ... SELECT statements that copy `template` and its rows once per (i, k) of `copies`."""
    new = _new_id(dialect)
    earlier = {  # each copy a second older than the one before, as a tenant's sessions are
        "sqlite": "datetime({c}, printf('-%d seconds', i)) || substr({c}, 20)",
        "postgresql": "{c} - make_interval(secs => i)",
    }[dialect]
    tenant = f"CASE WHEN k = 0 THEN t.tenant_id ELSE '{OTHER_TENANT}' END"
    out = []
    for name in ("sessions", *CHILDREN):
        table = Base.metadata.tables[name]
        cols, exprs = [], []
        for col in table.columns:
            if col.name == "id" and name == "session_logs":
                continue  # its own autoincrement
            cols.append(col.name)
            if col.name == "id":
                exprs.append(new if name == "sessions" else f"substr({new}, 1, 24) || substr(t.id, 25)")
            elif col.name == "session_id":
                exprs.append(new)
            elif col.name == "tenant_id":
                exprs.append(tenant)
            elif col.name in TIMES:
                exprs.append(earlier.format(c=f"t.{col.name}"))
            else:
                exprs.append(f"t.{col.name}")
        key = "id" if name == "sessions" else "session_id"
        out.append(f"INSERT INTO {name} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
                   f"FROM {name} t, copies WHERE t.{key} = '{template}'")
    return out


def seed_sqlite(db: Path, template: str, per_tenant: int) -> None:
    con = sqlite3.connect(db)
    try:
        con.execute("CREATE TEMP TABLE copies (i INTEGER, k INTEGER)")
        con.executemany("INSERT INTO copies VALUES (?, ?)", ((i, k) for k in (0, 1) for i in range(1, per_tenant + 1)))
        with con:
            for statement in _copy_statements("sqlite", template):
                con.execute(statement)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


async def seed_postgres(url: str, template: str, per_tenant: int) -> None:
    import asyncpg

    con = await asyncpg.connect(url)
    try:
        async with con.transaction():
            await con.execute(f"CREATE TEMP TABLE copies AS SELECT i, k FROM generate_series(1, {int(per_tenant)}) i, "
                              "(VALUES (0), (1)) v(k)")
            for statement in _copy_statements("postgresql", template):
                await con.execute(statement)
        await con.execute("ANALYZE")
    finally:
        await con.close()


async def template_session(c: Client) -> str:
    """One real session as a client leaves it: two turns, then deleted (ended, its snapshot taken)."""
    sid = (await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]
    for _ in range(2):
        await c.stream(sid, "bench-instant")
    await c.call("DELETE", f"/api/sessions/{sid}")
    return str(sid)


@contextlib.asynccontextmanager
async def held_server(model_url: str, http: aiohttp.ClientSession,
                      per_tenant: int) -> AsyncIterator[tuple[Client, str]]:
    """A server started again on a database with `per_tenant` ended sessions per tenant; yields its
    client and an old session's id."""
    data = Path(tempfile.mkdtemp(prefix="ashd-held-", dir="/tmp"))
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, data, ignore_errors=True)  # after the server, whatever happened
        env: dict[str, str] = {}
        if bs.POSTGRES:
            env["SERVICE_DATABASE_URL"] = await stack.enter_async_context(bs.fresh_database(bs.POSTGRES))
        async with ashd_server(model_url, prewarm=2, extra_env=env, data=data) as (url, key, _proc):
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            template = await template_session(c)
        t0 = time.perf_counter()
        if bs.POSTGRES:
            await seed_postgres(env["SERVICE_DATABASE_URL"], template, per_tenant)
        else:
            await asyncio.to_thread(seed_sqlite, data / "d" / "ashd.db", template, per_tenant)
        print(f"stored {2 * per_tenant:,} ended sessions (two tenants) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        async with ashd_server(model_url, prewarm=2, extra_env=env, data=data) as (url, key, _proc):
            label = f"server start to /health, {2 * per_tenant:,} held"
            print(f"{label:<42} {(time.perf_counter() - t0) * 1000:8.0f} ms")
            yield Client(http, url, key), template


async def reads(c: Client, old: str, out: dict[str, list[float]]) -> None:
    for row, path in zip(READS, ("/api/sessions", "/api/storage", f"/api/sessions/{old}",
                                 f"/api/sessions/{old}/messages", "/api/usage/stats"), strict=True):
        out[row].append((await timed(lambda p=path: c.call("GET", p)))[0])  # type: ignore[misc]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--held", type=int, default=20000,
                        help="ended sessions stored, half of them the bench's tenant's")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--postgres", metavar="URL", help="store in PostgreSQL (a fresh database per server)")
    args = parser.parse_args()
    bs.POSTGRES = args.postgres
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        await script_instant(http, model_url)
        # Both servers made the same way, the empty one with no copies: each started again on what it
        # stored, each with one old session its process has not seen.
        async with held_server(model_url, http, 0) as (empty, empty_old), \
                held_server(model_url, http, args.held // 2) as (held, old):
            rows: dict[str, dict[str, list[float]]] = {
                side: {row: [] for row in (*TABLE, *READS)} for side in ("empty", "held")}
            sides = [("empty", empty, empty_old), ("held", held, old)]
            # Interleaved, so that both servers see the same load, each first in every other round;
            # the table's rounds first, then the reads, so that no long list sits between two rows.
            for i in range(args.n):
                for side, c, _sid in sides[::1 - 2 * (i % 2)]:
                    await table_round(c, "bench", rows[side], gets=10)
            for i in range(args.n):
                for side, c, sid in sides[::1 - 2 * (i % 2)]:
                    await reads(c, sid, rows[side])
    held_label = f"held {args.held:,}"
    print(f"\n{'row (p50 ms, p99 in brackets)':<42} {'empty':>16} {held_label:>18} {'held/empty':>11}")
    for row in (*TABLE, *READS):
        e, h = rows["empty"][row], rows["held"][row]
        print(f"{row:<42} {statistics.median(e):8.2f} ({bs.pct(e, 0.99):6.2f}) {statistics.median(h):9.2f} "
              f"({bs.pct(h, 0.99):6.2f}) {statistics.median(h) / statistics.median(e):10.2f}x")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
