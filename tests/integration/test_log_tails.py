"""LogTails and SessionLogs against SQLite and PostgreSQL: a sandbox log file followed, its last
partial line stored at detach (also once the file is gone), floods skipped with a note, and the
per-session bound with its byte accounting."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ashd.actors import LogTails
from ashd.actors._session_logs import SWEEP_MAX_BYTES, SWEEP_MAX_LINES
from ashd.storage import Database, LogLine, Session, SessionLogs, Sessions


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    db = await Database.open(db_url)
    try:
        yield db
    finally:
        await db.close()


async def _session(db: Database) -> str:
    row = await Sessions(db).insert(Session(tenant_id="t", agent_name="a"))
    return row.id


async def _stored_bytes(db: Database, sid: str) -> int:
    return (await Sessions(db).get("t", sid)).stored_bytes


async def test_follow_detach_and_a_deleted_file(db: Database, tmp_path: Path) -> None:
    sid = await _session(db)
    path = tmp_path / "sandbox.log"
    path.write_text("from before the claim\n")
    tails = LogTails(SessionLogs(db), interval=3600)  # no sweep: flush and detach only
    await tails.attach(sid, "t", path)
    with open(path, "a") as f:
        f.write("one\ntwo\npartial")
    await tails.flush(sid)
    got = await SessionLogs(db).list("t", sid, -1, 100)
    assert [(x["index"], x["level"], x["text"], x["source"]) for x in got] == [
        (0, "stderr", "one", "sandbox"), (1, "stderr", "two", "sandbox")]
    with open(path, "a") as f:
        f.write(" line, then the sandbox died\n last words")
    os.unlink(path)  # its directory is removed; the open descriptor still reads it
    await tails.detach(sid)
    texts = [x["text"] for x in await SessionLogs(db).list("t", sid, 1, 100)]
    assert texts == ["partial line, then the sandbox died", " last words"]
    assert await SessionLogs(db).list("other-tenant", sid, -1, 100) == []
    await tails.close()


async def test_a_sandbox_started_for_the_session_is_followed_from_its_first_line(db: Database, tmp_path: Path) -> None:
    # It starts while the server connects: its first lines can be there before the tail is.
    sid = await _session(db)
    path = tmp_path / "sandbox.log"
    path.write_text("bridge listening\n")
    tails = LogTails(SessionLogs(db), interval=3600)
    await tails.attach(sid, "t", path, from_start=True)
    with open(path, "a") as f:
        f.write("later\n")
    await tails.flush(sid)
    assert [x["text"] for x in await SessionLogs(db).list("t", sid, -1, 100)] == ["bridge listening", "later"]
    await tails.close()


async def test_a_flood_is_skipped_with_a_note(db: Database, tmp_path: Path) -> None:
    sid = await _session(db)
    path = tmp_path / "sandbox.log"
    tails = LogTails(SessionLogs(db), interval=3600)
    await tails.attach(sid, "t", path)  # not there yet: opened once the sandbox creates it
    await tails.flush(sid)
    path.write_bytes(b"".join(b"flood %d\n" % i for i in range(SWEEP_MAX_LINES * 3)) + b"z" * SWEEP_MAX_BYTES)
    await tails.flush(sid)
    got = await SessionLogs(db).list("t", sid, -1, 1000)
    assert len(got) == SWEEP_MAX_LINES + 1
    assert got[0]["text"] == "flood 0" and got[SWEEP_MAX_LINES - 1]["text"] == f"flood {SWEEP_MAX_LINES - 1}"
    note = got[-1]
    assert note["level"] == "system" and "sandbox output skipped" in note["text"] and "lines" in note["text"]
    await tails.close()


async def test_a_session_keeps_its_newest_lines(db: Database) -> None:
    sid = await _session(db)
    logs = SessionLogs(db, max_lines=3)
    before = await _stored_bytes(db, sid)
    await logs.add(sid, "t", [LogLine("stdout", f"s{i}", step="setup.sh") for i in range(2)], source="setup")
    await logs.add(sid, "t", [LogLine("stderr", f"e{i}") for i in range(3)], source="sandbox")
    got = await logs.list("t", sid, -1, 100)
    assert [(x["index"], x["text"]) for x in got] == [(2, "e0"), (3, "e1"), (4, "e2")]
    # The setup lines' events stay (the events listing is not bounded by the log's bound).
    events = await Sessions(db).events("t", sid, 0, 100, "lifecycle")
    assert [e["data"] for e in events] == [
        '{"action": "setup", "step": "setup.sh", "level": "stdout", "text": "s0", "index": 0}',
        '{"action": "setup", "step": "setup.sh", "level": "stdout", "text": "s1", "index": 1}']
    # What the session holds counts the events like any; log lines are bounded by their count instead.
    assert await _stored_bytes(db, sid) - before == sum(len(e["data"]) for e in events)


async def test_a_sweep_never_reads_a_tail_detached_while_it_ran(db: Database, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    # A sweep walks the tails it saw when it began. One of them detached meanwhile has its file
    # closed, and the next file opened (another session's sandbox log) may get the same descriptor
    # number: the sweep must neither fail on it nor store the other session's lines as this one's.
    a, b, c = [await _session(db) for _ in range(3)]
    paths = {sid: tmp_path / f"{name}.log" for sid, name in ((a, "a"), (b, "b"), (c, "c"))}
    for path in paths.values():
        path.write_text("")
    tails = LogTails(SessionLogs(db), interval=3600)  # swept here by hand
    await tails.attach(a, "t", paths[a])
    await tails.attach(b, "t", paths[b])
    lines = {a: ["a wrote this"], b: ["b wrote this"], c: ["c wrote this", "and more than b"]}
    for sid, path in paths.items():
        path.write_text("".join(f"{line}\n" for line in lines[sid]))
    held = tails._tails[a].lock
    await held.acquire()  # the sweep waits inside a's turn while b goes and c comes
    sweep = asyncio.get_running_loop().create_task(tails.sweep())
    await asyncio.sleep(0)
    await tails.detach(b)
    await tails.attach(c, "t", paths[c], from_start=True)  # the descriptor b had, most likely
    held.release()
    with caplog.at_level(logging.ERROR, logger="ashd.actors._session_logs"):
        await sweep
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    await tails.flush(c)
    for sid in (a, b, c):
        assert [x["text"] for x in await SessionLogs(db).list("t", sid, -1, 100)] == lines[sid]
    await tails.close()
