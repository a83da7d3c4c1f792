#!/usr/bin/env python3
"""The floor under the speed table's short rows on this machine: the same HTTP exchange and the same
kind of work as a GET, a pause or a warm resume, with nothing of ashd around them.

    .venv/bin/python scripts/bench_floor.py [--n 400] [--ashd] [--idle]

It starts a minimal aiohttp server as a separate process (no middleware, no auth, no ORM) and
measures, from this process with the same aiohttp client as `bench_sessions.py`, interleaved:

- `GET` a cached session view: aiohttp's parse, a JSON encode, the response: the floor of a GET;
- the HTTP exchange plus a round trip to an actor that does nothing (one of ashd's `AioActor`s,
  reached with `_aio.call`): the crossing from the loop to an actor's thread and back;
- a transition's transaction (an `UPDATE ... RETURNING` of a session row and the `INSERT` of its
  event, committed, SQLite WAL with `synchronous=NORMAL`, as ashd runs it) on the loop's thread;
- the same transaction on the actor's thread: the shape of ashd's pause and warm resume;

and, in the server, the transaction alone in a tight loop and a loop-to-actor round trip alone.
With `--ashd` it also starts ashd (and the fake model) and measures a GET, a pause and a warm
resume of one of its sessions in the same rounds: what ashd adds over the floor is the difference
between the rows (docs/performance.md, tenth pass).

With `--idle` it then measures the floor's GET (and, with `--ashd`, ashd's GET) after the client
has waited 0, 2, 20, 200 and 1000 ms before each request: what an idle moment costs the next request
on this machine, whatever the server does (docs/performance.md, fourteenth pass); with `--ashd`
also a pause and a warm resume after 200 and 1000 ms, the writes that follow a quiet moment's WAL
checkpoint (thirty-sixth pass).

Both servers run the event loop `SERVICE_EVENT_LOOP` names (uvloop unless it says `asyncio`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ashd import event_loop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import PY, Client, ashd_server, fake_model, free_port, line, wait_http, wait_warm

ROWS = {
    "/view": "floor: GET, a cached view",
    "/cross": "floor: POST, an actor round trip",
    "/loop": "floor: POST, a transaction on the loop",
    "/actor": "floor: POST, a transaction on an actor",
}
ASHD_ROWS = ("ashd: GET a session", "ashd: pause", "ashd: warm resume")
IDLE_GAPS_MS = (0, 2, 20, 200, 1000)
# The columns a session row has, roughly: the view answered and the row returned are this wide.
COLUMNS = ("tenant_id", "agent_name", "status", "model", "config", "sandbox_id", "runner_id", "owner_id",
           "error", "parent_session_id", "created_at", "updated_at", "last_active_at")


class Transitions:
    """A session's transition as ashd stores it: the row's status and counters, and an event."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        cols = ", ".join(f"{c} TEXT" for c in COLUMNS)
        self.db.execute(f"CREATE TABLE sessions (id TEXT PRIMARY KEY, {cols}, next_event_seq INTEGER, "
                        "event_count INTEGER, stored_bytes INTEGER)")
        self.db.execute("CREATE TABLE events (id TEXT PRIMARY KEY, session_id TEXT, tenant_id TEXT, type TEXT, "
                        "data TEXT, sequence INTEGER, created_at TEXT)")
        self.db.execute("CREATE INDEX events_by_session ON events (session_id, sequence)")
        self.db.execute("INSERT INTO sessions VALUES (?, " + ", ".join("?" * len(COLUMNS)) + ", 1, 0, 0)",
                        ("s-1", *(f"{c}-value" for c in COLUMNS)))
        self.n = 0

    def run(self, status: str) -> dict[str, Any]:
        self.n += 1
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        data = json.dumps({"action": status, "status": status})
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "UPDATE sessions SET status = ?, updated_at = ?, next_event_seq = next_event_seq + 1, "
                "event_count = event_count + 1, stored_bytes = stored_bytes + ? WHERE id = ? RETURNING *",
                (status, now, len(data), "s-1"))
            names = [d[0] for d in cur.description]
            row = dict(zip(names, cur.fetchone(), strict=True))
            self.db.execute("INSERT INTO events VALUES (?, ?, ?, 'lifecycle', ?, ?, ?)",
                            (f"e-{self.n}", "s-1", row["tenant_id"], data, row["next_event_seq"], now))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return row


def serve(port: int, folder: Path) -> None:
    from ashd.actors._aio import AioActor, call

    store = Transitions(folder / "floor.db")

    class Worker(AioActor):
        def nothing(self) -> None:
            return None

        def transition(self, status: str) -> dict[str, Any]:
            return store.run(status)

    view = {"id": "s-1", **{c: f"{c}-value" for c in COLUMNS}, "messageCount": 0}

    async def on_view(_: web.Request) -> web.Response:
        return web.json_response({"session": view})

    async def on_cross(_: web.Request) -> web.Response:
        await call(worker.nothing(), 5)
        return web.json_response({"session": view})

    async def on_loop(_: web.Request) -> web.Response:
        return web.json_response({"session": store.run("paused")})

    async def on_actor(_: web.Request) -> web.Response:
        return web.json_response({"session": await call(worker.transition("paused"), 5)})

    async def inside(_request: web.Request) -> web.Response:
        """The transaction alone and a round trip alone, timed in this process."""
        tx, trips = [], []
        for _ in range(300):
            t0 = time.perf_counter()
            store.run("active")
            tx.append(time.perf_counter() - t0)
        for _ in range(300):
            t0 = time.perf_counter()
            await call(worker.nothing(), 5)
            trips.append(time.perf_counter() - t0)
        return web.json_response({"tx": statistics.median(tx) * 1000, "trip": statistics.median(trips) * 1000})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/view", on_view)
        for path, handler in (("/cross", on_cross), ("/loop", on_loop), ("/actor", on_actor)):
            app.router.add_post(path, handler)
        app.router.add_get("/inside", inside)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    ref = Worker.start()
    worker = ref.proxy()
    try:
        # The loop ashd would run here (SERVICE_EVENT_LOOP, inherited by both servers): the floor
        # and ashd are measured on the same one.
        event_loop.run(main(), os.environ.get("SERVICE_EVENT_LOOP", "auto"))
    finally:
        ref.stop()


async def timed_ms(http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    async with http.request(method, url, headers=headers) as resp:
        await resp.json()
        if resp.status >= 400:
            raise RuntimeError(f"{method} {url}: {resp.status}")
    return (time.perf_counter() - t0) * 1000


async def idle_costs(http: aiohttp.ClientSession, url: str, ashd: tuple[Client, str] | None, n: int) -> None:
    """Each request after the client waited `gap` ms (the server was idle that long, or, for ashd's,
    that long plus the request before it). ashd's pause and resume after 200 and 1000 ms: writes
    that follow a quiet moment's WAL checkpoint (storage/_checkpoint.py), as a client that calls now
    and then sends them."""
    for gap in IDLE_GAPS_MS:
        rounds = min(n, max(20, 20_000 // max(gap, 1)))  # about 20 s of waiting at most per gap and row
        times: dict[str, list[float]] = {"floor GET": [], "ashd GET": [], "ashd pause": [], "ashd warm resume": []}
        for _ in range(rounds):
            await asyncio.sleep(gap / 1000)
            times["floor GET"].append(await timed_ms(http, "GET", url + "/view", {}))
            if ashd is not None:
                c, sid = ashd
                base = f"{c.url}/api/sessions/{sid}"
                await asyncio.sleep(gap / 1000)
                times["ashd GET"].append(await timed_ms(http, "GET", base, c.headers))
                if gap >= 200:
                    for label, action in (("ashd pause", "/pause"), ("ashd warm resume", "/resume")):
                        await asyncio.sleep(gap / 1000)
                        times[label].append(await timed_ms(http, "POST", base + action, c.headers))
        for label, values in times.items():
            if values:
                line(f"after {gap} ms idle: {label}", values[rounds // 10:])


async def ashd_session(http: aiohttp.ClientSession, stack: contextlib.AsyncExitStack) -> tuple[Client, str]:
    model_url = await stack.enter_async_context(fake_model())
    url, key, _proc = await stack.enter_async_context(ashd_server(model_url, prewarm=1))
    c = Client(http, url, key)
    await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
    await wait_warm(c, 1)
    return c, (await c.call("POST", "/api/sessions", {"agent": "bench"}))["session"]["id"]


async def measure(n: int, with_ashd: bool, idle: bool = False) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ashd-floor-") as folder:
        proc = subprocess.Popen([PY, __file__, "--serve", str(port), folder])
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_http(url + "/view")
            times: dict[str, list[float]] = {label: [] for label in (*ROWS.values(), *ASHD_ROWS)}
            async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:
                ashd = await ashd_session(http, stack) if with_ashd else None
                for _ in range(n):  # interleaved: each row sees the same moments of the machine
                    for path, label in ROWS.items():
                        times[label].append(await timed_ms(http, "GET" if path == "/view" else "POST", url + path, {}))
                    if ashd is not None:
                        c, sid = ashd
                        base = f"{c.url}/api/sessions/{sid}"
                        for label, method, where in zip(ASHD_ROWS, ("GET", "POST", "POST"),
                                                        (base, base + "/pause", base + "/resume"), strict=True):
                            times[label].append(await timed_ms(http, method, where, c.headers))
                async with http.get(url + "/inside") as resp:
                    inside = await resp.json()
                for label, values in times.items():
                    if values:
                        line(label, values[n // 10:])  # the first tenth warms the connections and the caches
                print(f"{'in the server: the transaction alone':<42} p50 {inside['tx']:8.3f} ms")
                print(f"{'in the server: a loop-actor round trip':<42} p50 {inside['trip']:8.3f} ms")
                if idle:
                    await idle_costs(http, url, ashd, n)
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--ashd", action="store_true", help="also measure ashd's GET, pause and resume")
    parser.add_argument("--idle", action="store_true",
                        help="also measure a GET after 0, 2, 20, 200 and 1000 ms idle (and with --ashd, a pause "
                             "and a resume after 200 and 1000)")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), Path(args.serve[1]))
    else:
        asyncio.run(measure(args.n, args.ashd, args.idle))


if __name__ == "__main__":
    main()
