#!/usr/bin/env python3
"""Where a session operation's time goes on the server: a timeline of named spans per operation.

Starts the fake model and an ashd server whose interpreter loads a `sitecustomize` from a temporary
directory (nothing of it is in the package): it wraps the functions named in `SPANS` (the HTTP
handler, the registry's calls, the actor's stages, the pool's claim, the workspace copy, the
bridge's `init`, the transition's transaction...) so that each call writes its start and duration
on the host's monotonic clock, the same clock this client marks each operation with. Then runs
`--n` rounds of: create (pre-warmed sandbox), GET, first `message` frame, pause, warm resume,
DELETE, and prints for each operation the median of each span: where it starts after the request
reached the server, how long it takes, and on which thread. Work that runs beside the operations
(a sandbox's launch or destroy, a snapshot, a WAL checkpoint) is shown where it overlaps one; with
`--slowest K`, each operation's K slowest are printed span by span after its medians.

    .venv/bin/python scripts/bench_trace.py [--n 40] [--only create] [--keep FILE] [--slowest K]

The spans add a few microseconds each; compare the timeline's parts with each other, and the
operations' totals with `scripts/bench_sessions.py`. A name in `SPANS` that no longer exists is
reported, not fatal (docs/performance.md, ninth pass, for how the figures were read).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import Client, ashd_server, fake_model, first_message_frame, wait_warm

# module, attribute path, label. Wrapped in the server: a coroutine, a generator (an actor's stage,
# `yield from` it) or a plain function each keeps its kind.
SPANS: list[tuple[str, str, str]] = [
    ("aiohttp.web_protocol", "RequestHandler.data_received", "request bytes read and parsed"),
    ("aiohttp.web_protocol", "RequestHandler._handle_request", "HTTP"),
    ("aiohttp.web_protocol", "RequestHandler.finish_response", "response written"),
    ("ashd.http._sessions", "body_object", "body"),
    ("ashd.storage._agents", "Agents.resolve", "agent resolve"),
    ("ashd.actors._sessions", "SessionRegistry.create", "registry.create"),
    ("ashd.actors._sessions", "SessionRegistry.delete", "registry.delete"),
    ("ashd.actors._sessions", "SessionRegistry.pause", "registry.pause"),
    ("ashd.actors._sessions", "SessionRegistry.resume", "registry.resume"),
    ("ashd.actors._sessions", "SessionRegistry.begin_turn", "registry.begin_turn"),
    ("ashd.backends._local", "LocalBackend.message", "backend.message"),
    ("ashd.http._sse", "SseSink.open", "stream headers"),
    ("ashd.sandboxing._model_proxy", "ModelProxy._handle", "model proxy call"),
    ("ashd.http._sse", "SseSink.send", "frame written"),
    ("ashd.storage._sessions", "Sessions.insert_soon", "row insert"),
    ("ashd.actors._session", "SessionActor.start", "actor thread start"),
    ("ashd.actors._session", "SessionActor._start_sandbox", "start sandbox (actor)"),
    ("ashd.actors._pool", "PoolActor.claim", "pool claim (pool thread)"),
    ("ashd.actors._session", "prepare_workspace", "workspace copy"),
    ("ashd.actors._session", "SessionActor._connect_and_init", "connect + init (loop)"),
    ("ashd.sandboxing._bridge_client", "BridgeConnection.init", "bridge init round trip"),
    ("ashd.actors._session", "SessionActor._transition", "transition (actor)"),
    ("ashd.actors._session", "SessionActor._end_then_snapshot", "end (actor)"),
    ("ashd.actors._pool", "PoolActor.mark_ready", "pool mark_ready (pool thread)"),
    # Work beside the operations, shown where it overlaps one (docs/performance.md, twenty-eighth pass).
    ("ashd.actors._pool", "PoolActor._prepare_and_launch", "beside: a sandbox's launch"),
    ("ashd.actors._pool", "PoolActor._destroy_now", "beside: a sandbox's destroy"),
    ("ashd.actors._snapshot", "SnapshotActor._snapshot", "beside: a snapshot"),
    ("ashd.storage._checkpoint", "WalCheckpointer.checkpoint", "beside: a WAL checkpoint"),
]

SITECUSTOMIZE = '''
import functools, importlib, inspect, os, threading, time
_out = open(os.environ["ASHD_TRACE_FILE"], "a", buffering=1)

def _wrap(owner, attr, label):
    fn = getattr(owner, attr)
    def note(t0):
        _out.write(f"S\\t{label}\\t{t0 * 1000:.4f}\\t{(time.perf_counter() - t0) * 1000:.4f}\\t"
                   f"{threading.current_thread().name}\\n")
    if inspect.iscoroutinefunction(fn):
        async def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                note(t0)
    elif inspect.isgeneratorfunction(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return (yield from fn(*a, **k))
            finally:
                note(t0)
    else:
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                note(t0)
    setattr(owner, attr, functools.wraps(fn)(wrapper))

for module, path, label in SPANS:
    try:
        owner = importlib.import_module(module)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        _wrap(owner, attr, label)
    except Exception as exc:
        _out.write(f"W\\t{module}.{path}: {exc!r}\\n")
'''

OPERATIONS = ("create", "GET", "first message", "pause", "warm resume", "DELETE")


def sitecustomize_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ashd-trace-"))
    (folder / "sitecustomize.py").write_text(f"SPANS = {SPANS!r}\n{SITECUSTOMIZE}")
    return folder


class Marks:
    """The client's operations on the shared monotonic clock: (name, start ms, end ms, the client's
    figure in ms: the whole call, or for a message the time to its first `message` frame)."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, float, float, float]] = []

    async def time(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        t0 = time.perf_counter() * 1000
        result = await fn()
        t1 = time.perf_counter() * 1000
        self.ops.append((name, t0, t1, float(result) if name == "first message" else t1 - t0))
        return result


async def rounds(c: Client, n: int, marks: Marks) -> None:
    for _ in range(n):
        await wait_warm(c, 1)
        await asyncio.sleep(0.05)  # the spare's own warm-up is done; the machine is as a client finds it
        body = await marks.time("create", lambda: c.call("POST", "/api/sessions", {"agent": "bench"}))
        await one_session(c, body["session"]["id"], marks)


async def one_session(c: Client, sid: str, marks: Marks) -> None:
    await marks.time("GET", lambda: c.call("GET", f"/api/sessions/{sid}"))
    await marks.time("first message", lambda: first_message_frame(c, sid, "bench-instant"))
    await marks.time("pause", lambda: c.call("POST", f"/api/sessions/{sid}/pause"))
    await marks.time("warm resume", lambda: c.call("POST", f"/api/sessions/{sid}/resume"))
    await marks.time("DELETE", lambda: c.call("DELETE", f"/api/sessions/{sid}"))


def read_spans(path: Path) -> tuple[list[tuple[str, float, float, str]], list[str]]:
    spans, warnings = [], []
    for line in path.read_text().splitlines():
        kind, *rest = line.split("\t")
        if kind == "S":
            label, start, duration, thread = rest
            spans.append((label, float(start), float(duration), thread))
        elif kind == "W":
            warnings.append(rest[0])
    spans.sort(key=lambda s: s[1])
    return spans, warnings


def _beside(span: tuple[str, float, float, str], t0: float, t1: float) -> bool:
    """Work beside the operations counts where it overlaps one, started before it or not."""
    return span[0].startswith("beside:") and span[1] < t1 and span[1] + span[2] > t0


def report(marks: Marks, spans: list[tuple[str, float, float, str]], only: str | None, slowest: int = 0) -> None:
    by_op: dict[str, dict[str, list[tuple[float, float, str]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    totals: dict[str, list[float]] = collections.defaultdict(list)
    each: dict[str, list[tuple[float, list[tuple[str, float, float, str]]]]] = collections.defaultdict(list)
    for name, t0, t1, figure in marks.ops[2 * len(OPERATIONS):]:  # the first two rounds warm the paths
        inside = [s for s in spans if t0 <= s[1] <= t1 or _beside(s, t0, t1)]
        http = [s for s in inside if s[0] == "HTTP"]
        if not http:
            continue
        origin = http[0][1]
        totals[name].append(figure)
        each[name].append((figure, [(label, start - origin, took, thread) for label, start, took, thread in inside]))
        seen: collections.Counter[str] = collections.Counter()
        for label, start, duration, thread in inside:
            seen[label] += 1
            key = label if seen[label] == 1 else f"{label} #{seen[label]}"
            by_op[name][key].append((start - origin, duration, thread))
    for name in OPERATIONS:
        if (only and name != only) or name not in by_op:
            continue
        print(f"\n{name}: client {statistics.median(totals[name]):.3f} ms p50 (n={len(totals[name])}); "
              "spans after the request reached the server, p50")
        print(f"  {'span':<34} {'starts at':>10} {'takes':>9}   thread")
        rows = sorted(by_op[name].items(), key=lambda kv: statistics.median(v[0] for v in kv[1]))
        for key, values in rows:
            threads = collections.Counter(v[2].rstrip("0123456789-_") for v in values)
            print(f"  {key:<34} {statistics.median(v[0] for v in values):8.3f} ms "
                  f"{statistics.median(v[1] for v in values):7.3f} ms   {threads.most_common(1)[0][0]}"
                  f"{'' if len(values) == len(totals[name]) else f' (in {len(values)} of {len(totals[name])})'}")
        for figure, own in sorted(each[name], key=lambda e: e[0])[-slowest:] if slowest else []:
            print(f"  one of the {slowest} slowest: client {figure:.3f} ms")
            for label, start, duration, thread in own:
                print(f"    {label:<32} {start:8.3f} ms {duration:7.3f} ms   {thread}")


async def main(args: argparse.Namespace) -> None:
    trace = Path(args.keep) if args.keep else Path(tempfile.mkstemp(prefix="ashd-trace-", suffix=".tsv")[1])
    trace.write_text("")
    site = sitecustomize_dir()
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    marks = Marks()
    env = {"PYTHONPATH": path, "ASHD_TRACE_FILE": str(trace)}
    try:
        async with fake_model() as model_url, \
                ashd_server(model_url, prewarm=2, extra_env=env) as (url, key, _proc), \
                aiohttp.ClientSession() as http:
            c = Client(http, url, key)
            await c.call("POST", "/api/agents", {"name": "bench", "systemPrompt": "You benchmark."})
            await rounds(c, args.n + 2, marks)
        spans, warnings = read_spans(trace)
    finally:
        shutil.rmtree(site, ignore_errors=True)
        if not args.keep:
            trace.unlink(missing_ok=True)
    for warning in warnings:
        print(f"not traced: {warning}")
    report(marks, spans, args.only, args.slowest)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40, help="rounds measured (two more run first, unmeasured)")
    parser.add_argument("--only", choices=OPERATIONS, help="print this operation's timeline only")
    parser.add_argument("--keep", help="write the raw spans to this file and keep it")
    parser.add_argument("--slowest", type=int, default=0,
                        help="also print the spans of each operation's K slowest (its tail, and what ran beside it)")
    asyncio.run(main(parser.parse_args()))
