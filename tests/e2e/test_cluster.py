"""The multi-machine layout end to end (issue 11): PostgreSQL, an S3-compatible server, two
coordinators behind nginx (round robin, no sticky sessions) and runners, all real `ashd` processes
(tests/fixtures/cluster.py). Every client request goes through nginx.

What an operator who outgrew one machine relies on: sessions spread over the runners by free
capacity; 503 with the interface's message when no runner is there; a runner that dies (`kill -9`)
has its sessions paused within liveness + sweep time, and they resume on the other runner with
their files (from S3) and history; a runner stopped with SIGTERM drains and deregisters, its
sessions paused at once; a coordinator killed mid-stream costs the client nothing (it reconnects
through nginx with Last-Event-ID and gets every frame it missed once, in order, then the rest
live; the turn is stored once); a restarted coordinator leaves the sessions alone, and one with a
local pool pauses only the sessions of its own pool.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, IncompleteRead
from typing import Any

import pytest

from tests.fixtures.cluster import (  # noqa: F401  (fixtures)
    JITTER,
    LIVENESS,
    SWEEP,
    Cluster,
    cluster_factory,
    http,
    model_process,
    postgres_url,
    s3_keys,
    wait_until,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.postgres]
Factory = Callable[..., Cluster]
# Sweeps run in every coordinator on a loaded 2-core machine: slack for a late heartbeat or sweep.
SLACK = 4.0

WRITE_TURNS: list[dict[str, Any]] = [
    {"content": [{"type": "text", "text": "Writing the file."},
                 {"type": "tool_use", "name": "Write",
                  "input": {"file_path": "hello.txt", "content": "written on the first runner"}}]},
    {"content": [{"type": "text", "text": "Done: hello.txt written."}]},
]


def busy_turns(seconds: int) -> list[dict[str, Any]]:
    return [{"content": [{"type": "tool_use", "name": "Bash", "input": {"command": f"sleep {seconds}"}}]},
            {"content": [{"type": "text", "text": "slept"}]}]


def step_turns(steps: int) -> list[dict[str, Any]]:
    """A turn of `steps` tool calls, each 0.6 s, then a final text: stored frames spread over time."""
    turns: list[dict[str, Any]] = [
        {"content": [{"type": "text", "text": f"step {i}"},
                     {"type": "tool_use", "name": "Bash", "input": {"command": f"sleep 0.6; echo out-{i}"}}]}
        for i in range(steps)]
    turns.append({"content": [{"type": "text", "text": "all steps done"}]})
    return turns


# --- SSE over a plain HTTP connection ---------------------------------------------------------------
class Stream:
    """One SSE response read frame by frame; a connection cut by a dying server just ends it."""

    def __init__(self, cluster: Cluster, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        host = cluster.url.removeprefix("http://")
        self.conn = HTTPConnection(host, timeout=120)
        hdrs = {"Authorization": f"Bearer {cluster.key}", **(headers or {})}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        self.conn.request(method, path, json.dumps(body) if body is not None else None, hdrs)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, (self.resp.status, self.resp.read())
        self.upstream = self.resp.getheader("X-Upstream", "")  # the coordinator nginx chose

    def frames(self) -> Iterator[dict[str, Any]]:
        event: dict[str, Any] = {}
        while True:
            try:
                raw = self.resp.readline()
            except (IncompleteRead, ConnectionError, OSError):
                return
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            if not line:
                if "event" in event:
                    yield event
                event = {}
            elif line.startswith("event: "):
                event["event"] = line[7:]
            elif line.startswith("id: "):
                event["id"] = int(line[4:])
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])

    def close(self) -> None:
        self.conn.close()


def send(cluster: Cluster, sid: str, content: str) -> list[dict[str, Any]]:
    stream = Stream(cluster, "POST", f"/api/sessions/{sid}/messages", {"content": content})
    try:
        return list(stream.frames())
    finally:
        stream.close()


def replay(cluster: Cluster, sid: str, after: int) -> list[dict[str, Any]]:
    stream = Stream(cluster, "GET", f"/api/sessions/{sid}/stream", headers={"Last-Event-ID": str(after)})
    try:
        return list(stream.frames())
    finally:
        stream.close()


def in_background(cluster: Cluster, sid: str, content: str) -> threading.Thread:
    """A turn whose stream a thread reads to its end (the session stays busy meanwhile)."""
    def run() -> None:
        with contextlib.suppress(AssertionError, OSError):  # the session may be ended under it
            send(cluster, sid, content)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def kind_of(content: str) -> str:
    """The SDK message type of a stored message's content (JSON), or "" for a plain prompt."""
    try:
        parsed = json.loads(content)
    except ValueError:
        return ""
    return str(parsed.get("type", "")) if isinstance(parsed, dict) else ""


def running(cluster: Cluster, runner_id: str) -> int:
    return int(cluster.registered()[runner_id]["runningCount"])


# --- the tests ------------------------------------------------------------------------------------
def test_sessions_spread_over_the_runners_by_free_capacity(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={"runner-a": 3, "runner-b": 1})
    c.script("tok-busy", busy_turns(120))
    placed: list[str] = []
    threads = []
    try:
        for expected_running in range(1, 5):
            session = c.create()
            placed.append(session["id"])
            assert session["runnerId"] in ("runner-a", "runner-b"), session
            threads.append(in_background(c, session["id"], "stay busy tok-busy"))
            # The pick depends on the runners' heartbeats: wait until they report this one running.
            def reported(n: int = expected_running) -> bool:
                return running(c, "runner-a") + running(c, "runner-b") == n

            wait_until("the busy sessions reported by heartbeat", reported, 30)
        runners = [c.session(sid)["runnerId"] for sid in placed]
        # free = max − running − warming: a 3 vs b 1 → a; a 2 vs b 1 → a; 1 vs 1 → either; then the other.
        assert runners[:2] == ["runner-a", "runner-a"], runners
        assert runners[3] != runners[2], runners
        assert sorted(runners) == ["runner-a", "runner-a", "runner-a", "runner-b"], runners
        # Any coordinator serves any session: each one, asked directly, names the same runner.
        for proc in c.coordinators:
            for sid, runner in zip(placed, runners, strict=True):
                status, body = http("GET", f"http://127.0.0.1:{proc.port}/api/sessions/{sid}", c.key)
                assert status == 200 and body["session"]["runnerId"] == runner, body
    finally:
        for sid in placed:
            c.api("DELETE", f"/api/sessions/{sid}")
        for thread in threads:
            thread.join(timeout=60)


def test_no_runner_is_a_503_with_the_interfaces_message(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={})
    status, body = c.api("POST", "/api/sessions", {"agent": c.agent})
    assert status == 503, body
    assert body["statusCode"] == 503
    message = body["error"].lower()
    assert "no runners" in message and "available" in message and "no local backend" in message, body
    ids = set()
    for proc in c.coordinators:
        health = http("GET", f"http://127.0.0.1:{proc.port}/health")[1]
        assert health["remoteRunners"] == 0, health
        ids.add(health["coordinatorId"])
    assert len(ids) == 2, "each coordinator reports its own coordinatorId"
    # A runner registers: the same request now succeeds, on it.
    c.start_runner("runner-a", 2)
    assert c.create()["runnerId"] == "runner-a"
    for proc in c.coordinators:
        assert http("GET", f"http://127.0.0.1:{proc.port}/health")[1]["remoteRunners"] == 1


def test_a_killed_runner_pauses_its_sessions_which_resume_on_the_other(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={"runner-a": 2})
    lost = c.create()
    assert lost["runnerId"] == "runner-a"
    sid = lost["id"]
    c.script("tok-write", WRITE_TURNS)
    frames = send(c, sid, "write it tok-write")
    assert frames[-1]["event"] == "done", frames
    # A pause snapshots the workspace, uploaded to S3; then the session runs on, on runner-a.
    c.ok("POST", f"/api/sessions/{sid}/pause")
    wait_until("the snapshot in S3", lambda: any(sid in key for key in s3_keys(c)), 30)
    assert c.ok("POST", f"/api/sessions/{sid}/resume")["session"]["runnerId"] == "runner-a"

    c.start_runner("runner-b", 3)
    kept = c.create()
    assert kept["runnerId"] == "runner-b"  # 3 free against 2

    c.runners["runner-a"].kill9()
    killed_at = time.monotonic()
    wait_until("the lost runner's session paused", lambda: c.session(sid)["status"] == "paused",
               LIVENESS + SWEEP + JITTER + SLACK + 10, 0.1)
    took = time.monotonic() - killed_at
    print(f"runner-a's session paused {took:.1f} s after kill -9")
    assert took <= LIVENESS + SWEEP + JITTER + SLACK, f"paused after {took:.1f} s"
    assert c.session(kept["id"])["status"] == "active"  # the live runner's session is left alone
    alive = {rid for rid, row in c.registered().items() if row.get("alive", True)}
    assert "runner-a" not in alive and "runner-b" in alive
    events = c.ok("GET", f"/api/sessions/{sid}/events")["events"]
    assert any("runner" in json.dumps(e).lower() and e.get("type") == "lifecycle" for e in events), events

    # The client resumes it: cold, on runner-b, with its files from S3 and its conversation.
    resumed = c.ok("POST", f"/api/sessions/{sid}/resume")["session"]
    assert resumed["runnerId"] == "runner-b" and resumed["status"] == "active", resumed
    assert resumed.get("workspaceRestored") is True, resumed
    status, body = c.api("GET", f"/api/sessions/{sid}/files/hello.txt?format=json")
    assert status == 200 and body["content"] == "written on the first runner", body
    texts = json.dumps(c.ok("GET", f"/api/sessions/{sid}/messages")["messages"])
    assert "write it tok-write" in texts and "Done: hello.txt written." in texts
    frames = send(c, sid, "and now? tok-after")
    assert frames[-1]["event"] == "done", frames
    status, asked = http("GET", f"{c.model_url}/_fake/requests?contains=tok-after")
    assert "write it tok-write" in json.dumps(asked["requests"][-1]["body"]), "the history was not sent"


def test_sigterm_drains_a_runner_and_deregisters_it(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={"runner-a": 2})
    drained = c.create()
    c.script("tok-drain", WRITE_TURNS)
    assert send(c, drained["id"], "write it tok-drain")[-1]["event"] == "done"
    c.start_runner("runner-b", 3)
    kept = c.create()
    assert (drained["runnerId"], kept["runnerId"]) == ("runner-a", "runner-b")

    assert c.runners["runner-a"].terminate() == 0
    # Deregistration pauses at once: by the time the runner has exited, nothing is left to wait for.
    assert c.session(drained["id"])["status"] == "paused"
    assert "runner-a" not in c.registered()
    assert c.session(kept["id"])["status"] == "active"

    resumed = c.ok("POST", f"/api/sessions/{drained['id']}/resume")["session"]
    assert resumed["runnerId"] == "runner-b" and resumed["status"] == "active", resumed
    assert resumed.get("workspaceRestored") is True, resumed
    status, body = c.api("GET", f"/api/sessions/{drained['id']}/files/hello.txt?format=json")
    assert status == 200 and body["content"] == "written on the first runner", body


def test_a_coordinator_killed_mid_stream_costs_the_client_nothing(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={"runner-a": 2, "runner-b": 2})
    sid = c.create()["id"]
    steps = 6
    c.script("tok-steps", step_turns(steps))
    stream = Stream(c, "POST", f"/api/sessions/{sid}/messages", {"content": "go tok-steps"})
    victim = next(p for p in c.coordinators if stream.upstream.endswith(f":{p.port}"))
    seen: list[dict[str, Any]] = []
    for frame in stream.frames():
        seen.append(frame)
        if sum(1 for f in seen if "id" in f) == 2:
            victim.kill9()  # mid-stream: the turn goes on, on its runner
            break
    seen.extend(stream.frames())  # whatever was already on its way; then the cut
    stream.close()
    assert not seen or seen[-1]["event"] != "done", "the turn ended before the coordinator died"
    last = max(f["id"] for f in seen if "id" in f)

    asked_at_reconnect = c.model_requests("tok-steps")
    rest = replay(c, sid, last)  # through nginx: the other coordinator answers
    assert asked_at_reconnect < steps + 1, "the turn was over before the client reconnected: nothing was live"
    assert rest and rest[-1]["event"] == "done", rest
    got = [f["id"] for f in seen if "id" in f] + [f["id"] for f in rest if "id" in f]
    assert got == sorted(set(got)), f"a frame twice or out of order: {got}"
    everything = [f["id"] for f in replay(c, sid, 0) if "id" in f]
    assert got == everything, "a frame was missed"
    texts = [b.get("text") for f in seen + rest if f["event"] == "message" and f["data"].get("type") == "assistant"
             for b in f["data"]["message"]["content"] if b.get("type") == "text"]
    assert texts == [f"step {i}" for i in range(steps)] + ["all steps done"], texts

    # Stored once: one prompt, one final answer, one model call per step.
    messages = c.ok("GET", f"/api/sessions/{sid}/messages")["messages"]
    kinds = [kind_of(m["content"]) for m in messages]
    assert sum("go tok-steps" in m["content"] for m in messages if m["role"] == "user") == 1
    assert sum("all steps done" in m["content"] for m, k in zip(messages, kinds, strict=True) if k == "assistant") == 1
    assert kinds.count("result") == 1, kinds
    assert c.model_requests("tok-steps") == steps + 1
    assert send(c, sid, "still there?")[-1]["event"] == "done"  # served by the survivor


def test_a_restarted_coordinator_leaves_the_sessions_alone(cluster_factory: Factory) -> None:  # noqa: F811
    c = cluster_factory(runners={"runner-a": 2, "runner-b": 2})
    c.script("tok-busy", busy_turns(4))
    first = c.create()
    second = c.create()
    busy = in_background(c, first["id"], "stay busy tok-busy")
    wait_until("the turn running", lambda: running(c, first["runnerId"]) >= 1, 30)

    crashed, graceful = c.coordinators
    crashed.kill9()
    c.start_coordinator(crashed)
    # A rolling restart: the balancer uses the restarted one again before the other one stops.
    c.wait_balanced(crashed)
    assert graceful.terminate() == 0
    c.start_coordinator(graceful)
    c.wait_balanced(graceful)
    for session in (first, second):
        now = c.session(session["id"])
        assert (now["status"], now["runnerId"]) == ("active", session["runnerId"]), now
    busy.join(timeout=60)
    assert not busy.is_alive()
    # The restarted coordinators serve them: asked directly, each runs a turn.
    for proc, session in zip(c.coordinators, (first, second), strict=True):
        status, body = http("GET", f"http://127.0.0.1:{proc.port}/api/sessions/{session['id']}", c.key)
        assert status == 200 and body["session"]["status"] == "active", body
    assert send(c, first["id"], "hello again")[-1]["event"] == "done"
    assert send(c, second["id"], "hello again")[-1]["event"] == "done"


def test_a_restarted_coordinator_pauses_only_the_local_sessions_it_owned(cluster_factory: Factory) -> None:  # noqa: F811
    """The issue's complaint: a second server started on the same PostgreSQL paused every live
    session of the first. Here both coordinators keep a local pool (SERVICE_COORDINATOR_LOCAL,
    registered as a runner) and there is a runner: a coordinator's crash pauses only the sessions of
    its own pool, which any coordinator served meanwhile."""
    c = cluster_factory(runners={}, local=True)
    first, second = c.coordinators
    pools = {c.pool_of(first): first, c.pool_of(second): second}

    def direct(proc: Any, method: str, path: str, body: Any = None) -> Any:
        status, answer = http(method, f"http://127.0.0.1:{proc.port}{path}", c.key, body)
        assert status in (200, 201), (proc.name, method, path, status, answer)
        return answer

    # No runner yet: the sessions go to the pools. Two creates at once through one coordinator (within
    # one read of the runners table) are spread: the first placed counts against its pool.
    with ThreadPoolExecutor(2) as pool:
        created = list(pool.map(lambda _: direct(first, "POST", "/api/sessions", {"agent": c.agent})["session"],
                                range(2)))
    assert {s["runnerId"] for s in created} == set(pools), created
    by_pool = {pools[s["runnerId"]].name: s for s in created}
    mine, theirs = by_pool[first.name], by_pool[second.name]
    # Each coordinator serves the other's local session from that session's own sandbox.
    direct(second, "POST", f"/api/sessions/{mine['id']}/exec", {"command": "echo one > one.txt"})
    assert direct(first, "POST", f"/api/sessions/{mine['id']}/exec", {"command": "cat one.txt"})["stdout"] == "one\n"
    c.start_runner("runner-a", 2)
    remote = c.create()
    assert remote["runnerId"] == "runner-a"  # runners first: the pools are the fallback

    second.kill9()  # a crash, then a start: the other's sweep or its own start-up sweep pauses its sessions
    c.start_coordinator(second)
    assert c.session(mine["id"])["status"] == "active"  # the other coordinator's: left alone
    assert c.session(remote["id"])["status"] == "active"  # the runner's: left alone
    assert c.session(theirs["id"])["status"] == "paused"  # its own, whose sandbox died with it
    frames = [f["event"] for f in _direct_turn(second, c, mine["id"])]  # through the other coordinator
    assert frames[-1] == "done", frames
    assert send(c, remote["id"], "still there?")[-1]["event"] == "done"
    resumed = c.ok("POST", f"/api/sessions/{theirs['id']}/resume")["session"]
    # Its restarted pool registered again under the same id: the session goes back there (cold).
    assert resumed["status"] == "active" and resumed["runnerId"] == theirs["runnerId"], resumed


def _direct_turn(proc: Any, c: Cluster, sid: str) -> list[dict[str, Any]]:
    """A turn asked of one coordinator directly (its local pool holds the session)."""
    conn = HTTPConnection(f"127.0.0.1:{proc.port}", timeout=120)
    conn.request("POST", f"/api/sessions/{sid}/messages", json.dumps({"content": "hello local"}),
                 {"Authorization": f"Bearer {c.key}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    text = resp.read().decode()
    conn.close()
    return [{"event": line[7:]} for line in text.splitlines() if line.startswith("event: ")]
