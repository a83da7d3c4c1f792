# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""The bridge as a real process on a Unix socket, driven by the server's BridgeConnection."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from typing import Any

import pytest

from ashd.bridge import protocol as p
from ashd.devtools.fake_model import FakeModel
from ashd.errors import SandboxError
from ashd.sandboxing._bridge_client import BridgeConnection
from tests.fixtures.bridge_fixture import BridgeHarness, bridge, collect, messages_of  # noqa: F401
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401


class RawClient:
    """Speaks the protocol by hand, to test what BridgeConnection never sends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = p.FrameReader(sock)

    @classmethod
    async def open(cls, path: str) -> RawClient:
        conn = await BridgeConnection.connect(path, 30)  # waits for the bridge; then hand over
        await conn.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, path)
        return cls(sock)

    async def send_raw(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.send_raw(json.dumps(frame).encode() + b"\n")

    async def read(self) -> dict[str, Any]:
        async with asyncio.timeout(30):
            while True:
                frame = await self.reader.read()
                assert frame is not None, "bridge closed the connection"
                if frame["type"] != "log":
                    return frame


async def test_hello_init_query_done(bridge: BridgeHarness) -> None:
    conn = await bridge.connect()
    assert conn.ready["type"] == "ready"
    assert conn.ready["protocol"] == 2
    assert conn.pid == bridge.process.pid  # type: ignore[union-attr]
    assert conn.ready["bridgeVersion"]
    init_ok = await conn.init({})
    assert init_ok["type"] == "init_ok"
    assert init_ok["sessionId"]

    frames = await collect(conn, "hello bridge")
    assert [f["type"] for f in frames].count("done") == 1
    assert frames[-1]["type"] == "done"
    assert all(f["id"] == frames[-1]["id"] for f in frames)
    msgs = messages_of(frames)
    assert [m["type"] for m in msgs] == ["assistant", "result"]
    assert msgs[0]["message"]["content"][0]["text"] == "echo: hello bridge"
    assert msgs[1]["subtype"] == "success"
    assert msgs[1]["result"] == "echo: hello bridge"
    await conn.ping()


async def test_socket_is_private(bridge: BridgeHarness) -> None:
    await bridge.connect()
    assert stat.S_IMODE(os.stat(bridge.socket).st_mode) == 0o600


async def test_query_before_init_is_an_error_then_done(bridge: BridgeHarness) -> None:
    conn = await bridge.connect()
    frames = await collect(conn, "too early")
    assert [f["type"] for f in frames] == ["error", "done"]
    assert "init" in frames[0]["error"]


async def test_interrupt_during_a_tool_call(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    fake_model.script(
        "INTR-1",
        [{"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "sleep 60"}}]}],
    )
    conn = await bridge.init({})
    seen: list[dict[str, Any]] = []
    query = conn.query("INTR-1 go", query_id="q-intr")
    async for frame in query:
        seen.append(frame)
        if frame["type"] == "message" and frame["data"]["type"] == "assistant":
            await conn.interrupt("q-intr")
    tail = [f["type"] for f in seen[-2:]]
    assert tail == ["error", "done"]
    assert seen[-2]["error"] == "interrupted"
    # The conversation stays usable: the dangling tool call was answered.
    again = await collect(conn, "after interrupt")
    assert messages_of(again)[-1]["subtype"] == "success"
    last_request = fake_model.requests_containing("after interrupt")[-1]["body"]["messages"]
    results = [b for m in last_request for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert results[0]["is_error"] is True


async def test_an_interrupt_right_behind_its_query_ends_it(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    """A query and its interrupt sent back to back reach the bridge in one read, before the query's
    task has run: the query still ends with `error` and `done` (a task cancelled before its first
    step never runs its body, and the server would wait for them for ever)."""
    fake_model.script("RACE-1", [{"wait": 30, "content": [{"type": "text", "text": "never seen"}]}])
    conn = await bridge.init({})
    for i in range(5):
        assert conn.start_query(f"RACE-1 go {i}", query_id=f"q-race-{i}")
        await conn.interrupt(f"q-race-{i}", reason="right away")
        frames = await collect(conn, None, query_id=f"q-race-{i}", sent=True, timeout=20)
        assert [f["type"] for f in frames[-2:]] == ["error", "done"]
        assert frames[-2]["error"] == "interrupted: right away"
    assert messages_of(await collect(conn, "after the races"))[-1]["subtype"] == "success"


async def test_a_withdrawn_query_leaves_no_trace_in_the_conversation(bridge: BridgeHarness,
                                                                      fake_model: FakeModel) -> None:
    """`withdraw` (the server could not store the prompt it sent ahead): a running query ends with
    `interrupted: withdrawn`, one already ended is taken back too, and the next query's model call
    shows neither prompt nor any note about them."""
    fake_model.script("WD-SLOW", [{"wait": 30, "content": [{"type": "text", "text": "never seen"}]}])
    conn = await bridge.init({})
    assert conn.withdraws  # the builtin engine says so in its init_ok
    assert (await collect(conn, "WD-KEPT first"))[-1]["type"] == "done"

    # Running: its model call waits at the fake model.
    assert conn.start_query("WD-SLOW second", query_id="q-wd-1")
    frames = conn.query("WD-SLOW second", query_id="q-wd-1", sent=True)
    async with asyncio.timeout(30):
        while not fake_model.requests_containing("WD-SLOW second"):
            await asyncio.sleep(0.01)
        # The server drops a withdrawn query's frames; read them here to see how it ended.
        await conn._send(p.make(p.WITHDRAW, id="q-wd-1"))
        ended = [f async for f in frames]
    assert [f["type"] for f in ended][-2:] == ["error", "done"]
    assert ended[-2]["error"] == "interrupted: withdrawn"

    # Ended already: its answer goes with it.
    assert conn.start_query("WD-DONE third", query_id="q-wd-2")
    assert [f async for f in conn.query("WD-DONE third", query_id="q-wd-2", sent=True)][-1]["type"] == "done"
    await conn.withdraw("q-wd-2")

    # Withdrawn at once, mostly in the same read as its query: it ends before it began.
    assert conn.start_query("WD-GONE at once", query_id="q-wd-3")
    await conn.withdraw("q-wd-3")

    assert messages_of(await collect(conn, "WD-NEXT fourth"))[-1]["subtype"] == "success"
    sent = fake_model.requests_containing("WD-NEXT fourth")[-1]["body"]["messages"]
    text = json.dumps(sent)
    assert "WD-KEPT first" in text
    for gone in ("WD-SLOW", "WD-DONE", "WD-GONE", "interrupted"):
        assert gone not in text
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]


async def test_a_query_is_sent_ahead_only_where_nothing_else_is_being_written(bridge: BridgeHarness) -> None:
    conn = await bridge.init({})
    # A frame in progress (the socket's buffer full of a large one): the query would go in its middle.
    big = conn._send(p.make(p.PING, id="big", pad="x" * (4 * 1024 * 1024)))
    sending = asyncio.ensure_future(big)
    await asyncio.sleep(0)
    assert not conn.start_query("WD-LATER", query_id="q-later")
    await sending
    assert conn.start_query("WD-LATER", query_id="q-later")
    frames = [f async for f in conn.query("WD-LATER", query_id="q-later", sent=True)]
    assert messages_of(frames)[-1]["result"] == "echo: WD-LATER"


async def test_exec(bridge: BridgeHarness) -> None:
    conn = await bridge.init({"env": {"GREETING": "hi-from-env"}})
    (bridge.workspace / "f.txt").write_text("x")
    res = await conn.exec(["sh", "-c", 'ls; echo "$GREETING"; echo oops >&2; exit 3'])
    assert res["type"] == "exec_result"
    assert res["exitCode"] == 3
    assert res["stdout"].split() == ["f.txt", "hi-from-env"]
    assert res["stderr"].strip() == "oops"
    timed = await conn.exec(["sleep", "30"], timeout=0.5)
    assert timed["timedOut"] is True
    missing = await conn.exec(["/no/such/program"])
    assert missing["exitCode"] == 127


async def test_shutdown_exits_zero_and_removes_socket(bridge: BridgeHarness) -> None:
    conn = await bridge.init({})
    await conn.shutdown()
    assert bridge.process is not None
    assert await asyncio.wait_for(bridge.process.wait(), 30) == 0
    assert not os.path.exists(bridge.socket)


async def test_oversized_frame_is_refused_and_connection_survives(bridge: BridgeHarness) -> None:
    raw = await RawClient.open(bridge.socket)
    await raw.send({"type": "hello", "protocol": 1})
    assert (await raw.read())["type"] == "ready"
    big = b'{"type":"ping","id":"big","pad":"' + b"x" * p.MAX_FRAME_BYTES + b'"}\n'
    sender = asyncio.create_task(raw.send_raw(big + b'{"type":"ping","id":"small"}\n'))
    refused = await raw.read()
    assert refused["type"] == "error"
    assert "frame refused" in refused["error"]
    assert await raw.read() == {"type": "pong", "id": "small"}
    await sender
    raw.sock.close()


async def test_unknown_fields_and_types_are_ignored(bridge: BridgeHarness) -> None:
    raw = await RawClient.open(bridge.socket)
    await raw.send({"type": "hello", "protocol": 2, "protocols": [1, 2, 3], "client": "future", "x": {"y": 1}})
    ready = await raw.read()
    assert ready["type"] == "ready"
    assert ready["protocol"] == 2
    await raw.send({"type": "init", "id": "i1", "config": {"futureOption": True}, "extra": 1})
    assert (await raw.read())["type"] == "init_ok"
    await raw.send({"type": "some_future_notice", "payload": 1})  # no id: silently ignored
    await raw.send({"type": "query", "id": "q1", "prompt": "hi", "futureField": [1, 2]})
    types = []
    while True:
        frame = await raw.read()
        types.append(frame["type"])
        if frame["type"] == "done":
            break
    assert types == ["message", "message", "done"]
    raw.sock.close()


async def test_handshake_rules(bridge: BridgeHarness) -> None:
    raw = await RawClient.open(bridge.socket)
    await raw.send({"type": "ping", "id": "early"})
    early = await raw.read()
    assert early["type"] == "error"
    assert "hello" in early["error"]
    await raw.send({"type": "hello", "protocol": 99})
    refused = await raw.read()
    assert refused["type"] == "error"
    assert "unsupported" in refused["error"]
    raw.sock.close()


async def test_a_new_connection_replaces_the_old_one(bridge: BridgeHarness) -> None:
    first = await bridge.init({})
    second = await bridge.connect()
    with pytest.raises(SandboxError):
        await first.ping()
    await second.ping()
    # The engine survives the reconnect: no second init needed.
    frames = await collect(second, "still there?")
    assert messages_of(frames)[-1]["subtype"] == "success"


async def test_setup_runs_once_and_logs_outside_the_workspace(bridge: BridgeHarness) -> None:
    (bridge.workspace / "setup.sh").write_text("echo setting-up; echo done > made-by-setup.txt\n")
    logs: list[dict[str, Any]] = []
    conn = await BridgeConnection.connect(bridge.socket, 30, on_log=logs.append)
    await conn.init({"runSetup": True, "setupTimeout": 60})
    assert (bridge.workspace / "made-by-setup.txt").read_text() == "done\n"
    assert "setting-up" in (bridge.home / ".ashd-logs" / "setup.sh.log").read_text()
    assert not (bridge.workspace / ".ashd").exists()
    await conn.ping()  # log frames sent before init_ok were read on the way
    assert any("setting-up" in f["message"] for f in logs)
    (bridge.workspace / "made-by-setup.txt").unlink()
    await conn.init({"runSetup": True})
    assert not (bridge.workspace / "made-by-setup.txt").exists()


async def test_a_home_with_no_setup_step_is_marked_and_a_later_init_runs_none(bridge: BridgeHarness) -> None:
    # Nothing to run at the first init: the home is still marked as set up (after init_ok), so a
    # setup.sh written since (by the agent, say) is not run by a later init on this home.
    conn = await bridge.connect()
    await conn.init({"runSetup": True})
    await conn.ping()
    assert (bridge.home / ".ashd-logs" / "setup.done").read_text() == "ok\n"
    (bridge.workspace / "setup.sh").write_text("echo ran > made-by-setup.txt\n")
    await conn.init({"runSetup": True})
    assert not (bridge.workspace / "made-by-setup.txt").exists()


async def test_failing_setup_answers_error(bridge: BridgeHarness) -> None:
    (bridge.workspace / "setup.sh").write_text("echo first-line; echo broken >&2; exit 3\n")
    conn = await bridge.connect()
    with pytest.raises(SandboxError) as info:
        await conn.init({"runSetup": True})
    assert "setup.sh failed (exit 3)" in str(info.value)
    assert "broken" in str(info.value)


async def test_a_paused_reader_pauses_the_engine(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    turns = 12
    big = "x" * 100_000
    glob = {"type": "tool_use", "name": "Glob", "input": {"pattern": "none"}}
    script = [{"content": [{"type": "text", "text": big}, glob], "chunk": 10_000}]
    fake_model.script("BP-1", script * turns + [{"content": [{"type": "text", "text": "end"}]}])
    # 1.2 MB of text passes a 200k-token window: a window large enough keeps compaction out of it.
    conn = await bridge.init({"model": "claude-fake-model", "contextWindow": 2_000_000})
    frames = conn.query("BP-1 go")
    first = await frames.__anext__()
    assert first["type"] == "message"
    # While the consumer holds back, the bridge can only get a few frames ahead (kernel buffers):
    # the pong queued behind them arrives before the engine could race through all the turns.
    await conn.ping()
    assert len(fake_model.requests_containing("BP-1")) <= 4
    rest = [frame async for frame in frames]
    assert rest[-1]["type"] == "done"
    assert messages_of(rest)[-1]["num_turns"] == turns + 1


async def test_each_bridge_warms_up_in_process_as_it_starts(bridge: BridgeHarness, fake_model: FakeModel) -> None:
    """A bridge runs one first turn as it starts (ashd/bridge/_warm.py), so that its first real turn
    does not pay for the pages it copies from the fork server: answered in process, it never
    reaches the model, and the first real turn is answered as usual."""
    await bridge.stop()  # again, with the warm-up's own line in its log
    bridge.connections.clear()
    await bridge.start("--log-level", "DEBUG")
    conn = await bridge.connect()
    deadline = asyncio.get_running_loop().time() + 60
    while "bridge warm-up done" not in bridge.log_text():
        assert "warm-up failed" not in bridge.log_text(), bridge.log_text()
        assert asyncio.get_running_loop().time() < deadline, bridge.log_text()
        await asyncio.sleep(0.02)
    await conn.init({})
    msgs = messages_of(await collect(conn, "after the warm-up"))
    assert msgs[-1]["subtype"] == "success" and msgs[-1]["result"] == "echo: after the warm-up"
    assert [r["body"]["messages"][-1]["content"][0]["text"] for r in fake_model.requests] == ["after the warm-up"]


async def test_a_bridge_given_its_session_at_once_skips_the_warm_up(bridge: BridgeHarness) -> None:
    """A create with no spare left starts a bridge and inits it at once: the warm-up would only
    compete with the session's own start, so it is skipped."""
    await bridge.stop()
    bridge.connections.clear()
    await bridge.start("--log-level", "DEBUG")
    conn = await bridge.init({})
    deadline = asyncio.get_running_loop().time() + 60
    while "bridge warm-up skipped" not in bridge.log_text():
        assert "warm-up done" not in bridge.log_text(), bridge.log_text()
        assert asyncio.get_running_loop().time() < deadline, bridge.log_text()
        await asyncio.sleep(0.02)
    msgs = messages_of(await collect(conn, "no warm-up"))
    assert msgs[-1]["subtype"] == "success"
