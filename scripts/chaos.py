#!/usr/bin/env python3
"""Many clients doing anything to a few shared sessions at once, then what must still hold.

    .venv/bin/python scripts/chaos.py [--clients 8] [--slots 6] [--seconds 60] [--seed 1] [--postgres URL]
        [--runners N]

`--runners N` serves the clients from a coordinator with N `ashd runner`s behind it (on `--postgres`,
default ASHD_TEST_POSTGRES_URL's): every operation then crosses the seam to the runner that holds
the session, as on a deployment of several machines.

The table's benchmarks and the tests each do one thing to a session at a time. Here `--clients`
clients, each on its own connection, pick one of `--slots` sessions at random and do one of every
session operation to it, with no pause: GET, pause, resume, stop, a message read to its end (a
model turn with a tool call), a message whose reader goes away at its first frame, a slow message
interrupted by a second request, the messages, events and logs read, the files listed and one
read, a command run, a file uploaded, the workspace downloaded and restored, an attachment and a
message naming it, the sessions listed, a fork (deleted at once), a config change, a DELETE (and a
new session in its slot). Races between them are the point: a UI polling a session while its back
end stops or deletes it.

At the end every session made is deleted, and it checks, printing each breach:

- no answer was a 5xx (each is a race the client could not see, or a bug);
- the server logged nothing at `error`, and no sandbox exit (nothing here crashes one);
- every prompt whose stream ended with `done` and no `error` is among the session's stored
  messages, once;
- once every session is deleted, none is `active` and no sandbox but the pre-warmed is held.

It prints how many of each operation ran and their answers' statuses, with an example of each
error answer. Exit status 1 when something did not hold. The server's log is kept in the data
directory it names (docs/testing.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sessions as bs
from bench_coordinator import API_KEY, SECRET, Processes, wait_runners
from bench_sessions import ashd_server, fake_model, free_port, fresh_database, wait_http

OPS: list[tuple[str, int]] = [
    ("get", 10), ("pause", 5), ("resume", 5), ("stop", 2), ("message", 10), ("message-abort", 4),
    ("message-interrupt", 3), ("messages", 4), ("events", 2), ("logs", 2), ("files", 3), ("exec", 3),
    ("upload", 2), ("fork", 1), ("config", 1), ("delete", 2), ("bundle", 2), ("list", 1), ("attach", 1),
]
TURN_SCRIPTS = [
    {"match": "chaos-tool", "turns": [
        {"content": [{"type": "text", "text": "running"},
                     {"type": "tool_use", "name": "Bash", "input": {"command": "echo t >> turns.txt"}}]},
        {"content": [{"type": "text", "text": "done it"}]}]},
    {"match": "chaos-slow", "turns": [{"delay": 0.02, "content": [{"type": "text", "text": "slow " * 40}]}]},
]


PREWARM = 4
HUNG_S = 30.0  # no operation here takes this long (the slowest, a turn, takes well under a second)


class Tally:
    def __init__(self) -> None:
        self.statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        self.examples: dict[tuple[str, int], str] = {}
        self.breaches: list[str] = []
        self.sent: dict[str, set[str]] = collections.defaultdict(set)
        self.done: dict[str, set[str]] = collections.defaultdict(set)
        self.made: set[str] = set()

    def answer(self, op: str, status: int, text: str) -> None:
        self.statuses[op][status] += 1
        if status >= 400:
            self.examples.setdefault((op, status), text[:200])
        if status >= 500:
            self.breaches.append(f"{op}: {status} {text[:200]}")


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str, key: str, tally: Tally) -> None:
        self.http, self.url, self.tally = http, url, tally
        self.headers = {"Authorization": f"Bearer {key}"}
        self.doing: tuple[str, str, float] | None = None  # the operation in flight, its session, its start
        self.pending: list[asyncio.Task[Any]] = []  # interrupts sent beside a stream

    async def call(self, op: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        skip = () if body is not None else ("Content-Type",)
        async with self.http.request(method, self.url + path, json=body, headers=self.headers,
                                     skip_auto_headers=skip) as resp:
            text = (await resp.read()).decode(errors="replace")
            self.tally.answer(op, resp.status, text)
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    async def create(self) -> str | None:
        status, body = await self.call("create", "POST", "/api/sessions", {"agent": "chaos"})
        if status != 201:
            return None
        sid = str(body["session"]["id"])
        self.tally.made.add(sid)
        return sid

    async def message(self, sid: str, mode: str, attachments: list[str] | None = None) -> None:
        prompt = f"{'chaos-tool' if mode == 'message' else 'chaos-slow'} {uuid.uuid4().hex[:8]}"
        self.tally.sent[sid].add(prompt)
        events: list[str] = []
        body: dict[str, Any] = {"content": prompt, **({"attachments": attachments} if attachments else {})}
        async with self.http.post(f"{self.url}/api/sessions/{sid}/messages", headers=self.headers,
                                  json=body) as resp:
            if resp.status != 200:
                self.tally.answer(mode, resp.status, await resp.text())
                return
            self.tally.answer(mode, 200, "")
            async for raw in resp.content:
                if not raw.startswith(b"event:"):
                    continue
                events.append(raw[6:].strip().decode())
                if events[-1] == "message" and mode == "message-abort":
                    return  # the reader goes away; the turn goes on and is stored
                if events[-1] == "message" and mode == "message-interrupt" and events.count("message") == 1:
                    self.pending.append(asyncio.get_running_loop().create_task(
                        self.call("interrupt", "POST", f"/api/sessions/{sid}/interrupt")))
        if not events or events[-1] != "done":
            self.tally.breaches.append(f"{mode} {sid}: the stream ended without `done`: {events[-4:]}")
        elif "error" not in events:
            self.tally.done[sid].add(prompt)


async def _one(c: Client, slots: list[str], rnd: random.Random) -> None:
    i = rnd.randrange(len(slots))
    sid = slots[i]
    base = f"/api/sessions/{sid}"
    op = rnd.choices([name for name, _ in OPS], [weight for _, weight in OPS])[0]
    c.doing = (op, sid, time.monotonic())
    if op == "get":
        await c.call(op, "GET", base)
    elif op in ("pause", "resume", "stop"):
        await c.call(op, "POST", f"{base}/{op}")
    elif op.startswith("message-") or op == "message":
        await c.message(sid, op)
    elif op in ("messages", "events", "logs"):
        await c.call(op, "GET", f"{base}/{op}")
    elif op == "files":
        status, body = await c.call(op, "GET", f"{base}/files")
        files = body.get("files") if status == 200 and isinstance(body, dict) else None
        if files:
            entry = rnd.choice(files)
            if isinstance(entry, dict) and entry.get("path") and entry.get("type") != "directory":
                await c.call("file", "GET", f"{base}/files/{entry['path']}")
    elif op == "exec":
        await c.call(op, "POST", f"{base}/exec", {"command": "echo hi >> notes.txt; wc -l < notes.txt"})
    elif op == "upload":
        upload = {"path": f"up{rnd.randrange(5)}.txt", "content": "up\n" * rnd.randrange(1, 500), "encoding": "utf-8"}
        await c.call(op, "POST", f"{base}/files", {"files": [upload]})
    elif op == "fork":
        status, body = await c.call(op, "POST", f"{base}/fork")
        if status == 201:
            c.tally.made.add(str(body["session"]["id"]))
            await c.call("fork-delete", "DELETE", f"/api/sessions/{body['session']['id']}")
    elif op == "bundle":  # the workspace downloaded, then restored into the live one
        async with c.http.get(f"{c.url}{base}/workspace", headers=c.headers) as resp:
            data = await resp.read()
            c.tally.answer(op, resp.status, "" if resp.status == 200 else data.decode(errors="replace"))
        if resp.status == 200:
            await c.call("bundle-restore", "POST", f"{base}/workspace", {"bundle": base64.b64encode(data).decode()})
    elif op == "list":
        await c.call(op, "GET", "/api/sessions")
    elif op == "attach":  # an attachment, then a message that names it
        status, body = await c.call(op, "POST", f"{base}/attachments", {
            "filename": "note.txt", "content": base64.b64encode(b"attached\n").decode(), "mimeType": "text/plain"})
        if status == 201:
            await c.message(sid, "message", attachments=[body["attachment"]["id"]])
    elif op == "config":
        await c.call(op, "PATCH", f"{base}/config", {"model": rnd.choice(["claude-a", "claude-b"])})
    elif op == "delete":
        await c.call(op, "DELETE", base)
        new = await c.create()
        if new is not None:
            slots[i] = new


async def _client(c: Client, slots: list[str], until: float, rnd: random.Random) -> int:
    n = 0
    while time.monotonic() < until:
        try:
            await _one(c, slots, rnd)
        except (TimeoutError, aiohttp.ClientError) as exc:
            op, sid, t0 = c.doing or ("?", "?", time.monotonic())
            c.tally.breaches.append(f"{op} {sid}: client error after {time.monotonic() - t0:.1f} s: {exc!r}")
        c.doing = None
        n += 1
    for result in await asyncio.gather(*c.pending, return_exceptions=True):
        if isinstance(result, BaseException):
            c.tally.breaches.append(f"interrupt: client error: {result!r}")
    return n


async def _watch(clients: list[Client], tally: Tally) -> None:
    """Say at once when an operation has taken over HUNG_S (a hang to look at while it lasts)."""
    seen: set[tuple[str, str, float]] = set()
    while True:
        await asyncio.sleep(1)
        now = time.monotonic()
        for c in clients:
            if c.doing is not None and now - c.doing[2] > HUNG_S and c.doing not in seen:
                seen.add(c.doing)
                tally.breaches.append(f"{c.doing[0]} {c.doing[1]}: no answer for {HUNG_S:.0f} s")
                print(f"hung: {c.doing[0]} on {c.doing[1]}", file=sys.stderr, flush=True)


async def _check_stored(c: Client, tally: Tally) -> None:
    for sid, prompts in tally.done.items():
        status, body = await c.call("check", "GET", f"/api/sessions/{sid}/messages")
        if status != 200:
            tally.breaches.append(f"messages of {sid}: {status}")
            continue
        stored: collections.Counter[str] = collections.Counter()
        for m in body.get("messages", []) if isinstance(body, dict) else body:
            if m.get("role") != "user":
                continue
            text = json.dumps(m.get("content"))
            for prompt in tally.sent[sid]:
                if prompt in text:
                    stored[prompt] += 1
        for prompt in prompts:
            if stored[prompt] != 1:
                tally.breaches.append(f"{sid}: a prompt answered `done` is stored {stored[prompt]} times")


async def _check_released(c: Client, tally: Tally, runner_urls: list[str]) -> None:
    for sid in sorted(tally.made):
        await c.call("cleanup", "DELETE", f"/api/sessions/{sid}")
    health: Any = None
    for _ in range(100):
        _, health = await c.call("health", "GET", "/health")
        pools = [health.get("pool", {})]
        for url in runner_urls:  # a runner's own /health: its pool (the coordinator's has none)
            async with c.http.get(url + "/health") as resp:
                pools.append((await resp.json()).get("pool", {}))
        if health.get("activeSessions") == 0 and all(p.get("waiting", 0) + p.get("running", 0) == 0 for p in pools):
            return
        await asyncio.sleep(0.1)
    tally.breaches.append(f"after every session was deleted: {json.dumps(health)[:300]}")


@contextlib.asynccontextmanager
async def _standalone(model_url: str, data: Path) -> AsyncIterator[tuple[str, str, list[str]]]:
    env = {"SERVICE_MAX_SANDBOXES": "64", "SERVICE_LOG_LEVEL": "info"}
    async with ashd_server(model_url, prewarm=PREWARM, extra_env=env, data=data) as (url, key, _proc):
        yield url, key, []


@contextlib.asynccontextmanager
async def _cluster(model_url: str, data: Path, runners: int, pg: str) -> AsyncIterator[tuple[str, str, list[str]]]:
    """A coordinator and `runners` runners on a fresh database, their logs `<name>.log` in `data`."""
    procs = Processes(data, model_url)
    async with fresh_database(pg) as db:  # dropped after the processes using it have stopped
        try:
            coord = free_port()
            procs.start("coordinator", "serve", SERVICE_MODE="coordinator", SERVICE_PORT=str(coord),
                        SERVICE_DATABASE_URL=db, SERVICE_API_KEY=API_KEY, SERVICE_INTERNAL_SECRET=SECRET,
                        SERVICE_LOG_LEVEL="info")
            url = f"http://127.0.0.1:{coord}"
            await wait_http(url + "/health", 120)
            runner_urls = []
            for i in range(runners):
                port = free_port()
                procs.start(f"runner-{i + 1}", "runner", SERVICE_RUNNER_ID=f"runner-{i + 1}", SERVICE_SERVER_URL=url,
                            SERVICE_RUNNER_PORT=str(port), SERVICE_PORT=str(free_port()),
                            SERVICE_RUNNER_ADVERTISE_HOST="127.0.0.1", SERVICE_DATABASE_URL=db,
                            SERVICE_INTERNAL_SECRET=SECRET, SERVICE_MAX_SANDBOXES="32",
                            SERVICE_PREWARM=str(PREWARM // runners or 1), SERVICE_LOG_LEVEL="info")
                runner_urls.append(f"http://127.0.0.1:{port}")
            async with aiohttp.ClientSession() as http:
                await wait_runners(bs.Client(http, url, API_KEY), runners)
            yield url, API_KEY, runner_urls
        finally:
            procs.stop()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slots", type=int, default=6, help="sessions the clients share")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--postgres", metavar="URL", help="store in PostgreSQL (a fresh database)")
    parser.add_argument("--runners", type=int, default=0,
                        help="serve from a coordinator with this many runners (PostgreSQL: --postgres or the default)")
    args = parser.parse_args()
    bs.POSTGRES = args.postgres
    rnd = random.Random(args.seed)
    tally = Tally()
    data = Path(tempfile.mkdtemp(prefix="ashd-chaos-", dir="/tmp"))
    pg = args.postgres or os.environ.get("ASHD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    async with fake_model() as model_url, aiohttp.ClientSession() as http:
        for script in TURN_SCRIPTS:
            await http.post(model_url + "/_fake/scripts", json=script)
        server = _cluster(model_url, data, args.runners, pg) if args.runners else _standalone(model_url, data)
        async with server as (url, key, runner_urls):
            admin = Client(http, url, key, tally)
            await admin.call("agent", "POST", "/api/agents", {"name": "chaos", "systemPrompt": "You are chaos."})
            slots = [sid for sid in [await admin.create() for _ in range(args.slots)] if sid]
            https = [aiohttp.ClientSession() for _ in range(args.clients)]
            clients = [Client(h, url, key, tally) for h in https]
            watch = asyncio.create_task(_watch(clients, tally))
            t0 = time.monotonic()
            try:
                counts = await asyncio.gather(*(_client(c, slots, t0 + args.seconds, random.Random(rnd.random()))
                                                for c in clients))
            finally:
                watch.cancel()
                for h in https:
                    await h.close()
            wall = time.monotonic() - t0
            await asyncio.sleep(2)  # the aborted readers' turns finish and are stored
            await _check_stored(admin, tally)
            await _check_released(admin, tally, runner_urls)
    logs = sorted(data.glob("*.log"))
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            # Nothing here makes a sandbox crash: one said to have exited is one let go taken for a crash.
            if ('"level": "error"' in line or '"level": "critical"' in line or line.startswith("Traceback")
                    or '"msg": "sandbox exited' in line):
                tally.breaches.append(f"{log.name}: {line[:300]}")
    print(f"{sum(counts)} operations by {args.clients} clients on {args.slots} shared sessions in {wall:.1f} s "
          f"({sum(counts) / wall:,.0f}/s), {len(tally.made)} sessions made")
    for op, statuses in sorted(tally.statuses.items()):
        print(f"  {op:<18} " + "  ".join(f"{status}: {n}" for status, n in sorted(statuses.items())))
    for (op, status), text in sorted(tally.examples.items()):
        print(f"  e.g. {op} {status}: {text}")
    if tally.breaches:
        print(f"{len(tally.breaches)} breaches (the servers' logs: {', '.join(str(log) for log in logs)}):")
        for breach in tally.breaches[:50]:
            print("  " + breach)
        return 1
    shutil.rmtree(data, ignore_errors=True)
    print("every check held")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
