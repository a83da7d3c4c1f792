"""Session rows in storage (storage/_sessions.py) on a real SQLite database: what clients read back
(masked secrets, message and event pages), the counters a tenant's quota sums, forks, purges and
the bulk pause of sessions a dead process left running. test_storage.py runs the shared parts on
PostgreSQL too; these are the quick ones scripts/mutation runs for every mutant of the module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from ashd.errors import NotFound
from ashd.storage import Attachment, Database, Message, Session
from ashd.storage._models import SessionEvent
from ashd.storage._sessions import EventRecord, Sessions, mask_mcp, session_json


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}")
    try:
        yield db
    finally:
        await db.close()


def _bytes(*texts: str) -> int:
    return sum(len(t.encode()) for t in texts)


async def _neighbours(sessions: Sessions, tenant: str = "t") -> list[tuple[object, ...]]:
    """Two sessions of the same tenant whose ids sort just before and after "s-5", the id the tests
    give the session they work on, each with a message and an event: a query that matched ids by
    order instead of equality would read or change them. Returns what they hold, to compare after."""
    for sid in ("s-0", "s-z"):
        await sessions.insert(Session(id=sid, tenant_id=tenant, agent_name="a", status="paused"))
        await sessions.add_user_message(sid, tenant, f"neighbour {sid}")
        await sessions.transition(sid, tenant, "paused", "paused")
    return await _held(sessions, tenant)


async def _attach(db: Database, attachment_id: str, session_id: str, message_id: str | None = None) -> None:
    async with db.tx() as s:
        s.add(Attachment(id=attachment_id, tenant_id="t", session_id=session_id, message_id=message_id,
                         filename="a.txt", mime_type="text/plain", size=1))


async def _attachments(db: Database) -> dict[str, tuple[str, str | None]]:
    async with db.read() as s:
        rows = (await s.execute(select(Attachment.id, Attachment.session_id, Attachment.message_id))).all()
    return {r[0]: (r[1], r[2]) for r in rows}


async def _held(sessions: Sessions, tenant: str = "t") -> list[tuple[object, ...]]:
    held: list[tuple[object, ...]] = []
    for sid in ("s-0", "s-z"):
        row = await sessions.get(tenant, sid)
        held.append((row.status, row.turn_open, row.message_count, row.event_count, row.stored_bytes,
                     row.next_message_seq, row.next_event_seq, row.model, row.config,
                     [m["content"] for m in await sessions.messages(tenant, sid, 0, 100)],
                     [e["data"] for e in await sessions.events(tenant, sid, 0, 100, None)]))
    return held


async def _event_rows(db: Database, session_id: str) -> list[SessionEvent]:
    async with db.read() as s:
        return list((await s.execute(select(SessionEvent).where(SessionEvent.session_id == session_id)
                                     .order_by(SessionEvent.sequence))).scalars())


def test_mcp_secrets_are_masked_and_the_rest_shown() -> None:
    servers: dict[str, Any] = {
        "gh": {"command": "gh-mcp", "env": {"GH_TOKEN": "ghp_secret", "LEVEL": "debug"}},
        "web": {"url": "https://x", "headers": {"Authorization": "Bearer s", "X-Api-Key": "k", "X-Trace": "on",
                                                  "Cookie-Secret": "c", "X-Password": "p", "Accept": "json"}},
        "odd": "not-a-dict",
    }
    shown = mask_mcp(servers)
    assert shown == {
        "gh": {"command": "gh-mcp", "env": {"GH_TOKEN": "***", "LEVEL": "***"}},
        "web": {"url": "https://x", "headers": {"Authorization": "***", "X-Api-Key": "***", "X-Trace": "on",
                                                  "Cookie-Secret": "***", "X-Password": "***", "Accept": "json"}},
        "odd": "not-a-dict",
    }
    assert servers["gh"]["env"]["GH_TOKEN"] == "ghp_secret"  # the stored config is not changed
    assert mask_mcp(None) is None
    assert mask_mcp({}) == {}


def test_session_json_shows_config_and_masks_secrets() -> None:
    config = {"systemPrompt": "be brief", "permissionMode": "default", "allowedTools": ["Read"], "diskMb": 64,
              "network": {"allow": ["x.org"]}, "mcpServers": {"m": {"env": {"K": "v"}}}, "extraEnvKeys": ["DB_PASS"],
              "internalOnly": "never shown"}
    row = Session(id="s1", tenant_id="t", agent_name="a", sandbox_id="sb", status="active", model="m1",
                  config=json.dumps(config), credential_id="cred-1", env_ciphertext=b"\x00", error="boom")
    out = session_json(row)
    assert out["systemPrompt"] == "be brief" and out["allowedTools"] == ["Read"] and out["diskMb"] == 64
    assert out["network"] == {"allow": ["x.org"]} and "internalOnly" not in out and "betas" not in out
    assert out["mcpServers"] == {"m": {"env": {"K": "***"}}}
    assert out["credentialId"] == "cred-1" and out["extraEnv"] == {"DB_PASS": "***"} and out["error"] == "boom"
    assert (out["id"], out["tenantId"], out["agentName"], out["sandboxId"], out["status"], out["model"]) == \
        ("s1", "t", "a", "sb", "active", "m1")
    bare = session_json(Session(id="s2", tenant_id="t", agent_name="a", status="paused", config="{}"))
    for absent in ("credentialId", "extraEnv", "error", "mcpServers", "systemPrompt"):
        assert absent not in bare


async def test_get_and_list_are_per_tenant_newest_first(db: Database) -> None:
    sessions = Sessions(db)
    zeroth = await sessions.insert(Session(id="s-0", tenant_id="acme", agent_name="c", status="active"))
    first = await sessions.insert(Session(id="s-5", tenant_id="acme", agent_name="a", status="active"))
    second = await sessions.insert(Session(id="s-z", tenant_id="acme", agent_name="b", status="active"))
    await sessions.insert(Session(tenant_id="globex", agent_name="a", status="active"))
    assert (await sessions.get("acme", first.id)).id == first.id
    with pytest.raises(NotFound):
        await sessions.get("globex", first.id)
    assert [v["id"] for v in await sessions.list_views("acme", None)] == [second.id, first.id, zeroth.id]
    assert [v["id"] for v in await sessions.list_views("acme", "a")] == [first.id]
    assert [v["id"] for v in await sessions.list_views("acme", "b")] == [second.id]
    assert [v["id"] for v in await sessions.list_views("acme", None, limit=1)] == [second.id]
    assert (await sessions.get_any(first.id)) is not None and await sessions.get_any("nope") is None


async def test_a_listed_session_is_the_view_of_its_whole_row(db: Database) -> None:
    # The list reads only the columns the view shows: every field of a session's view, the masked
    # ones and those shown only when set, is the same in the list as from the whole row.
    sessions = Sessions(db)
    config = {"systemPrompt": "be brief", "mcpServers": {"m": {"env": {"K": "v"}}}, "extraEnvKeys": ["DB_PASS"],
              "network": {"allow": ["x.org"]}, "diskMb": 64, "subagents": {"r": {"prompt": "p"}}}
    full = await sessions.insert(Session(
        id="s-full", tenant_id="acme", agent_name="a", sandbox_id="sb", status="error", model="m1",
        runner_id="r-1", parent_session_id="s-parent", config=json.dumps(config), credential_id="cred-1",
        env_ciphertext=b"\x00", error="boom"))
    bare = await sessions.insert(Session(id="s-bare", tenant_id="acme", agent_name="a", status="paused"))
    listed = {v["id"]: v for v in await sessions.list_views("acme", None)}
    for row in (full, bare):
        assert listed[row.id] == session_json(await sessions.get("acme", row.id))
    assert listed[full.id]["extraEnv"] == {"DB_PASS": "***"} and listed[full.id]["mcpServers"]["m"]["env"] == \
        {"K": "***"} and listed[full.id]["error"] == "boom" and listed[full.id]["parentSessionId"] == "s-parent"


async def test_a_transition_sets_the_status_and_stores_its_event(db: Database) -> None:
    sessions = Sessions(db, owner_id="server-1")
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="starting", config='{"a": 1}'))
    assert row.owner_id == "server-1" and row.stored_bytes == _bytes('{"a": 1}')
    moved = await sessions.transition(row.id, "t", "active", "started", extra={"why": "x"}, sandbox_id="sb-1")
    assert moved.status == "active" and moved.sandbox_id == "sb-1" and moved.owner_id == "server-1"
    data = json.dumps({"action": "started", "status": "active", "why": "x"})
    assert moved.event_count == 1 and moved.stored_bytes == _bytes('{"a": 1}', data)
    events = await sessions.events("t", row.id, 0, 10, None)
    assert [(e["type"], json.loads(e["data"]), e["sequence"]) for e in events] == \
        [("lifecycle", {"action": "started", "status": "active", "why": "x"}, moved.next_event_seq)]
    again = await sessions.transition(row.id, "t", "paused", "paused")
    assert again.next_event_seq == moved.next_event_seq + 1 and again.event_count == 2
    with pytest.raises(NotFound):
        await sessions.transition("no-such-session", "t", "paused", "paused")
    assert await _held(sessions) == held


async def test_a_routed_row_is_left_to_its_runner(db: Database) -> None:
    sessions = Sessions(db, owner_id="coordinator-1")
    routed = await sessions.insert(Session(tenant_id="t", agent_name="a", status="starting", runner_id="runner-9"))
    assert routed.owner_id is None  # the runner claims it when it starts the sandbox
    mine = await sessions.insert(Session(tenant_id="t", agent_name="a", status="starting", runner_id="coordinator-1"))
    assert mine.owner_id == "coordinator-1"
    unclaimed = await Sessions(db).transition(routed.id, "t", "active", "started", sandbox_id="sb")
    assert unclaimed.owner_id is None  # a repository with no owner claims nothing
    plain = await sessions.transition(routed.id, "t", "paused", "paused")
    assert plain.owner_id is None  # no sandbox claimed by this transition


async def test_update_config_is_per_tenant_and_keeps_the_byte_count(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="paused", config='{"x": 1}'))
    new = {"systemPrompt": "longer prompt"}
    updated = await sessions.update_config(row.id, "t", "m2", new)
    assert updated.model == "m2" and json.loads(updated.config) == new
    assert updated.stored_bytes == _bytes(json.dumps(new))
    with pytest.raises(NotFound):
        await sessions.update_config(row.id, "other-tenant", "m3", {})
    assert (await sessions.get("t", row.id)).model == "m2"
    assert await _held(sessions) == held


async def test_a_fork_copies_the_conversation_in_order_and_tells_the_parent(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    parent = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="paused"))
    await sessions.add_user_message(parent.id, "t", "one")
    await sessions.store_turn_batch(parent.id, "t", [("assistant", '"two"')], [])
    await sessions.add_user_message(parent.id, "t", "three")
    before = await sessions.get("t", parent.id)
    child = await sessions.insert_fork(Session(tenant_id="t", agent_name="a", status="starting", config="{}"),
                                       parent.id)
    assert child.parent_session_id == parent.id and child.message_count == 3 and child.next_message_seq == 3
    copied = await sessions.messages("t", child.id, 0, 10)
    originals = await sessions.messages("t", parent.id, 0, 10)
    assert [m["content"] for m in copied] == [m["content"] for m in originals]
    assert [m["sequence"] for m in copied] == [1, 2, 3]
    assert child.stored_bytes == _bytes("{}", *(m["content"] for m in originals))
    after = await sessions.get("t", parent.id)
    (event,) = [e for e in await sessions.events("t", parent.id, 0, 10, None) if e["type"] == "lifecycle"]
    assert json.loads(event["data"]) == {"action": "forked", "status": "paused", "childSessionId": child.id}
    assert after.event_count == before.event_count + 1
    assert after.stored_bytes == before.stored_bytes + _bytes(event["data"])
    # The next message of the child follows the copies.
    assert await sessions.add_user_message(child.id, "t", "four") == 4
    assert await _held(sessions) == held


async def test_a_fork_of_an_empty_session(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    parent = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="paused"))
    child = await sessions.insert_fork(Session(tenant_id="t", agent_name="a", status="starting"), parent.id)
    assert child.message_count == 0 and await sessions.messages("t", child.id, 0, 10) == []
    assert await _held(sessions) == held


async def test_a_prompt_opens_the_turn_and_links_its_attachments(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))
    seq = await sessions.add_user_message(row.id, "t", "hi")
    assert seq == 1
    (message,) = await sessions.messages("t", row.id, 0, 10)
    assert json.loads(message["content"]) == {"type": "user", "content": "hi"} and message["role"] == "user"
    stored = await sessions.get("t", row.id)
    assert stored.turn_open is True and stored.message_count == 1
    assert stored.stored_bytes == _bytes(message["content"])
    await _attach(db, "att-1", row.id)
    await _attach(db, "att-old", row.id, message_id="earlier-message")
    await _attach(db, "att-other", "s-0")  # other sessions' (ids sorting either side): naming them links nothing
    await _attach(db, "att-later", "s-z")
    shown = [{"id": a, "filename": "a.txt", "mimeType": "text/plain", "size": 1, "path": "a.txt",
              "shownToModel": True} for a in ("att-1", "att-old", "att-other", "att-later")]
    assert await sessions.add_user_message(row.id, "t", "with a file", shown) == 2
    second = (await sessions.messages("t", row.id, 1, 10))[0]
    assert json.loads(second["content"])["attachments"] == shown
    assert await _attachments(db) == {"att-1": (row.id, second["id"]), "att-old": (row.id, "earlier-message"),
                                      "att-other": ("s-0", None), "att-later": ("s-z", None)}
    assert await _held(sessions) == held


async def test_a_turns_prompt_reserves_its_first_event_ids_in_the_same_write(db: Database) -> None:
    """The ids a turn's first frames get come with its user message (no write of their own before the
    first frame is sent); they never overlap ids reserved before or after, nor another session's."""
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))

    async def begin(session_id: str, content: str) -> tuple[int, int]:
        started = sessions.begin_turn_soon(session_id, "t", content, (), 64)  # as an actor's thread starts it
        return await (asyncio.wrap_future(started) if isinstance(started, Future) else started)

    before = await sessions.reserve_events(row.id, 3)  # say, a lifecycle event's ids
    seq, first = await begin(row.id, "hi")
    assert (seq, first) == (1, before + 3)
    assert await sessions.reserve_events(row.id, 1) == first + 64  # the next block starts after it
    seq2, first2 = await begin(row.id, "again")
    assert (seq2, first2) == (2, first + 65)
    with pytest.raises(NotFound):
        await begin("s-gone", "hi")
    assert await _held(sessions) == held


async def test_a_turn_batch_numbers_messages_counts_bytes_and_closes_the_turn(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))
    await sessions.add_user_message(row.id, "t", "hi")
    base = await sessions.get("t", row.id)
    first = await sessions.reserve_events(row.id, 2)
    events = [EventRecord(first, "message", {"text": "yo"}, "message", '{"text": "yo"}'),
              EventRecord(first + 1, "frame", None, "done", '{"sessionId": "x"}')]
    await sessions.store_turn_batch(row.id, "t", [("assistant", '"a1"'), ("assistant", '"a2"')], events)
    after = await sessions.get("t", row.id)
    assert after.turn_open is False  # the done frame is stored: nothing to recover
    assert after.message_count == 3 and after.event_count == base.event_count + 2
    assert after.stored_bytes == base.stored_bytes + _bytes('"a1"', '"a2"', json.dumps({"text": "yo"}),
                                                            '{"text": "yo"}', '{"sessionId": "x"}')
    assert [m["sequence"] for m in await sessions.messages("t", row.id, 0, 10)] == [1, 2, 3]
    frames = await sessions.frames_after(row.id, 0)
    assert [(f.sequence, f.event) for f in frames] == [(first, "message"), (first + 1, "done")]
    assert [(f.sequence, f.event) for f in await sessions.frames_after(row.id, first)] == [(first + 1, "done")]
    assert len(await sessions.frames_after(row.id, 0, limit=1)) == 1
    listed = await sessions.events("t", row.id, 0, 10, None)
    assert [(e["type"], e["data"]) for e in listed] == [("message", json.dumps({"text": "yo"}))]
    assert [r.data for r in await _event_rows(db, row.id) if r.type == "frame"] == [None]  # no "null"
    assert await _held(sessions) == held


async def test_a_batch_without_done_leaves_the_turn_open(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))
    await sessions.add_user_message(row.id, "t", "hi")
    first = await sessions.reserve_events(row.id, 1)
    await sessions.store_turn_batch(row.id, "t", [], [EventRecord(first, "message", {"t": 1}, "message", "{}")])
    stored = await sessions.get("t", row.id)
    assert stored.turn_open is True and stored.message_count == 1
    await sessions.store_turn_batch(row.id, "t", [], [])  # nothing to store: nothing changes
    assert (await sessions.get("t", row.id)).event_count == stored.event_count
    assert await _held(sessions) == held


async def test_message_and_event_pages(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))
    for text in ("m1", "m2", "m3"):
        await sessions.add_user_message(row.id, "t", text)
    page = await sessions.messages("t", row.id, 1, 1)
    assert [json.loads(m["content"])["content"] for m in page] == ["m2"]
    first = await sessions.reserve_events(row.id, 4)
    await sessions.store_turn_batch(row.id, "t", [], [
        EventRecord(first, "message", {"n": 1}), EventRecord(first + 1, "compaction", {"n": 2}),
        EventRecord(first + 2, "frame", None, "done", "{}"), EventRecord(first + 3, "tool", {"n": 4})])
    events = await sessions.events("t", row.id, 0, 10, None)
    assert [e["type"] for e in events] == ["message", "tool"]  # compaction only when asked for
    assert [e["type"] for e in await sessions.events("t", row.id, 0, 10, "compaction")] == ["compaction"]
    assert [e["sequence"] for e in await sessions.events("t", row.id, first, 1, None)] == [first + 3]
    for other in ("a-tenant", "zz-tenant"):  # tenants whose names sort before and after "t"
        # Another tenant's session is not found, in the same read as its rows would be (HTTP: 404).
        for read in (sessions.messages(other, row.id, 0, 10), sessions.events(other, row.id, 0, 10, None),
                     sessions.events(other, row.id, 0, 10, "compaction")):
            with pytest.raises(NotFound):
                await read
    with pytest.raises(NotFound):
        await sessions.messages("t", "s-unknown", 0, 10)
    assert await sessions.all_message_contents(row.id) == [{"type": "user", "content": t} for t in ("m1", "m2", "m3")]
    assert await _held(sessions) == held


async def test_purge_deletes_the_session_and_its_rows_for_its_tenant_only(db: Database) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    row = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="ended"))
    keep = await sessions.insert(Session(tenant_id="t", agent_name="a", status="ended"))
    for sid in (row.id, keep.id, "s-0", "s-z"):
        await _attach(db, f"att-{sid}", sid)
    for sid in (row.id, keep.id):
        await sessions.add_user_message(sid, "t", "x")
        await sessions.transition(sid, "t", "ended", "ended")
    with pytest.raises(NotFound):
        await sessions.purge("other-tenant", row.id)
    with pytest.raises(NotFound):
        await sessions.purge("t", "s-missing")  # between the ids of real sessions: still not found
    await sessions.purge("t", row.id)
    assert await sessions.get_any(row.id) is None
    async with db.read() as s:
        left = (await s.execute(select(func.count()).select_from(Message).where(Message.session_id == row.id))).scalar()
    assert left == 0 and await _event_rows(db, row.id) == []
    assert len(await sessions.messages("t", keep.id, 0, 10)) == 1 and len(await _event_rows(db, keep.id)) == 1
    assert sorted(await _attachments(db)) == sorted(f"att-{sid}" for sid in (keep.id, "s-0", "s-z"))
    assert await _held(sessions) == held


async def test_owners_of_sandboxes_ignores_ended_sessions(db: Database) -> None:
    sessions = Sessions(db)
    live = await sessions.insert(Session(tenant_id="t", agent_name="a", status="paused", sandbox_id="sb-1"))
    ended = await sessions.insert(Session(tenant_id="t", agent_name="a", status="ended", sandbox_id="sb-2"))
    running = await sessions.insert(Session(tenant_id="t", agent_name="a", status="active", sandbox_id="sb-4"))
    assert await sessions.owners_of_sandboxes(["sb-1", "sb-2", "sb-3", "sb-4"]) == {"sb-1": live.id,
                                                                                   "sb-4": running.id}
    assert await sessions.owners_of_sandboxes([]) == {}
    # A restart's rescue asks for ended ones too (a DELETE's final snapshot follows its answer).
    assert await sessions.owners_of_sandboxes(["sb-1", "sb-2", "sb-3"], ended=True) == {"sb-1": live.id,
                                                                                       "sb-2": ended.id}


async def test_pause_orphans_picks_the_dead_process_sessions_only(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    sessions = Sessions(db)

    async def add(status: str, **kw: str | None) -> str:
        return (await sessions.insert(Session(tenant_id="t", agent_name="a", status=status, **kw))).id

    on_runner = await add("active", runner_id="r1", owner_id="r1")
    starting_on_runner = await add("starting", runner_id="r1")
    paused_on_runner = await add("paused", runner_id="r1")
    on_other = await add("active", runner_id="r2", owner_id="r2")
    on_lower = await add("active", runner_id="r0", owner_id="r0")
    owned_here = await add("active", owner_id="srv")
    routed_here = await add("starting", runner_id="srv")  # not claimed yet: the sweep still takes it
    routed_on = await add("active", runner_id="sz")  # routed to a runner whose name sorts after
    unowned = await add("active")
    seen: list[tuple[str, str, str, str]] = []

    async def note(tenant: str, sid: str, agent: str, status: str) -> None:
        seen.append((tenant, sid, agent, status))

    assert sorted(await sessions.pause_orphans("r1", "runner_lost", on_paused=note)) == \
        sorted([on_runner, starting_on_runner])
    assert sorted(seen) == sorted([("t", on_runner, "a", "active"), ("t", starting_on_runner, "a", "starting")])
    assert (await sessions.get("t", paused_on_runner)).status == "paused"
    assert (await sessions.get("t", on_other)).status == "active"
    (event,) = await sessions.events("t", on_runner, 0, 10, None)
    assert json.loads(event["data"]) == {"action": "paused", "status": "paused", "reason": "runner_lost"}

    assert sorted(await sessions.pause_orphans(owner_id="srv")) == sorted([owned_here, routed_here])
    assert (await sessions.get("t", unowned)).status == "active"
    assert await sessions.pause_orphans(owner_id="srv", unowned=True) == [unowned]
    assert (await sessions.get("t", on_other)).status == "active"
    assert sorted(await sessions.pause_orphans()) == sorted([on_other, on_lower, routed_on])
    assert await sessions.pause_orphans() == []
    assert "cut short" not in caplog.text  # no turn was running: no warning for the operator


@pytest.mark.parametrize(("reason", "said"), [
    ("restart", "interrupted: the server stopped before this turn finished"),
    ("runner_deregistered", "interrupted: the runner stopped before this turn finished"),
    ("runner_lost", "interrupted: the runner stopped answering before this turn finished"),
    ("drain", "interrupted: the turn was cut short (drain)"),
])
async def test_an_interrupted_turn_is_stored_with_its_reason_and_counted(db: Database, reason: str, said: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    sessions = Sessions(db)
    held = await _neighbours(sessions)
    cut = await sessions.insert(Session(id="s-5", tenant_id="t", agent_name="a", status="active"))
    idle = await sessions.insert(Session(tenant_id="t", agent_name="a", status="starting"))
    await sessions.add_user_message(cut.id, "t", "never answered")
    before = await sessions.get("t", cut.id)
    assert sorted(await sessions.pause_orphans(reason=reason)) == sorted([cut.id, idle.id])
    assert "recorded turns cut short as interrupted" in caplog.text
    rows = await _event_rows(db, cut.id)
    error = json.dumps({"error": said})
    done = json.dumps({"sessionId": cut.id})
    paused = json.dumps({"action": "paused", "status": "paused", "reason": reason})
    assert [(r.type, r.data, r.frame_event, r.frame_data) for r in rows] == [
        ("error", error, "error", error), ("frame", None, "done", done), ("lifecycle", paused, None, None)]
    assert [r.sequence for r in rows] == [rows[0].sequence, rows[0].sequence + 1, rows[0].sequence + 2]
    after = await sessions.get("t", cut.id)
    assert after.status == "paused" and after.turn_open is False
    assert after.event_count == before.event_count + 3
    assert after.stored_bytes == before.stored_bytes + _bytes(paused, error, error, done)
    idle_after = await sessions.get("t", idle.id)
    assert idle_after.event_count == 1 and idle_after.stored_bytes == _bytes(paused)
    assert [r.type for r in await _event_rows(db, idle.id)] == ["lifecycle"]
    assert await _held(sessions) == held
