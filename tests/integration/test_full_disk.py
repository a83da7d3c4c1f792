"""A full data disk under a running server: a small tmpfs of the test's own holds the data dir (SQLite
database, sandboxes, snapshots, agents) and is filled for real. Clear 507s, reads still served,
nothing stored lost, no snapshot damaged, and everything works again once space is freed, without a
restart. The reserve is off here (SERVICE_DATA_DIR_MIN_FREE_MB=0) so that writes meet ENOSPC and
SQLITE_FULL themselves; the reserve has its own tests."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.small_fs import fill, free_bytes, small_fs
from tests.fixtures.sse import Frame, parse_frames
from tests.integration.test_sessions import create, deploy, send

pytestmark = pytest.mark.sandbox
MIB = 1024 * 1024
GATE = "while [ ! -e go ]; do sleep 0.05; done; echo released"


def disk_settings(data: Path, fake_url: str, **changes: Any) -> Settings:
    return Settings(data_dir=str(data), prewarm=0, zygote=True, anthropic_base_url=fake_url,
                    anthropic_api_key="sk-ant-test", rate_limit_rps=1000.0, rate_limit_burst=1000,
                    actor_timeout_seconds=30.0, data_dir_min_free_mb=0, data_dir_warn_free_mb=8,
                    storage_retry_seconds=60.0).with_(**changes)


@pytest.fixture
async def disk(aiohttp_client: Any, short_tmp: Path, fake_model: FakeModel,  # noqa: F811
               request: pytest.FixtureRequest) -> AsyncIterator[tuple[Api, Path]]:
    changes = getattr(request, "param", {})
    with small_fs(short_tmp / "data", 96, "tmpfs") as data:
        server, api = await start_api(aiohttp_client, disk_settings(data, fake_model.url, **changes))
        try:
            yield api, data
        finally:
            await api.client.close()
            await server.stop()


async def _get(api: Api, path: str) -> Any:
    status, body = await api.call("GET", path)
    assert status == 200, (path, body)
    return body


async def _history(api: Api, sid: str) -> tuple[Any, Any]:
    return ((await _get(api, f"/api/sessions/{sid}/messages?limit=1000"))["messages"],
            (await _get(api, f"/api/sessions/{sid}/events?limit=1000"))["events"])


def _snapshot_dir(data: Path, sid: str) -> list[str]:
    return sorted(os.listdir(data / "snapshots" / sid))


async def _wait_for(predicate: Any, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


def _is_507(status: int, body: Any) -> bool:
    return status == 507 and body["statusCode"] == 507 and "data disk is full" in body["error"]


async def test_full_disk_refuses_writes_serves_reads_and_recovers(disk: tuple[Api, Path]) -> None:
    api, data = disk
    await deploy(api)
    s1 = (await create(api))["id"]
    assert (await send(api, s1, "first words"))[0] == 200
    status, _ = await api.call("POST", f"/api/sessions/{s1}/stop")
    assert status == 200
    s2 = (await create(api))["id"]
    assert (await send(api, s2, "second session"))[0] == 200
    status, body = await api.call("POST", f"/api/sessions/{s2}/pause")
    assert status == 200, body

    async def s2_snapshotted() -> bool:
        return (data / "snapshots" / s2).is_dir() and bool(_snapshot_dir(data, s2))

    await _wait_for(s2_snapshotted)
    status, _ = await api.call("POST", f"/api/sessions/{s2}/resume")
    assert status == 200
    before = {sid: await _history(api, sid) for sid in (s1, s2)}
    files_before = await _get(api, f"/api/sessions/{s1}/files/AGENT.md?format=json")
    snapshots_before = {sid: _snapshot_dir(data, sid) for sid in (s1, s2)}

    # A change since s2's snapshot: its stop must write a new one (an unchanged workspace needs none).
    status, body = await api.call("POST", f"/api/sessions/{s2}/files",
                                  json={"files": [{"path": "late.txt", "content": "after the pause\n"}]})
    assert status == 200, body

    filler = fill(data)
    assert free_bytes(data) < MIB

    # Writes get a 507 that says what happened, and change nothing.
    status, body = await api.call("POST", "/api/agents", json={"name": "big", "systemPrompt": "x" * 300_000})
    assert _is_507(status, body), body
    status, body = await api.call("POST", "/api/sessions", json={"agent": "helper", "systemPrompt": "y" * 999_000})
    assert _is_507(status, body), body
    status, body = await api.call("POST", f"/api/sessions/{s2}/stop")
    assert _is_507(status, body), body
    assert "previous snapshot is kept" in body["error"]
    # A DELETE stores one small row. SQLite writes it into its write-ahead log, which may hold pages
    # it can reuse without growing the file (after a checkpoint, storage/_checkpoint.py, or pages a
    # refused larger write above already took): then the DELETE is stored even now, and its final
    # snapshot is owed until there is room (DELETE is how space comes back). Otherwise it is a 507.
    status, body = await api.call("DELETE", f"/api/sessions/{s2}")
    deleted = status == 200
    if deleted:
        assert body["session"]["status"] == "ended", body
    else:
        assert _is_507(status, body), body
        assert (await _get(api, f"/api/sessions/{s2}"))["session"]["status"] == "active"  # its sandbox is kept
    assert {sid: _snapshot_dir(data, sid) for sid in (s1, s2)} == snapshots_before  # no partial, none lost

    # Reads are served as before (a stored DELETE added its `ended` event, and nothing else).
    after = {sid: await _history(api, sid) for sid in (s1, s2)}
    if deleted:
        messages, events = after[s2]
        added = events[len(before[s2][1]):]
        assert [(e["type"], json.loads(e["data"])["status"]) for e in added] == [("lifecycle", "ended")], added
        after[s2] = (messages, events[: len(before[s2][1])])
    assert after == before
    assert await _get(api, f"/api/sessions/{s1}/files/AGENT.md?format=json") == files_before
    assert [s["id"] for s in (await _get(api, "/api/sessions"))["sessions"]] == [s2, s1]
    health = await _get(api, "/health")
    assert health["dataDir"]["state"] == "low" and health["dataDir"]["freeBytes"] < MIB
    metrics = await (await api.client.get("/metrics")).text()
    free_line = next(line for line in metrics.splitlines() if line.startswith("ash_data_dir_free_bytes "))
    assert float(free_line.split()[1]) < MIB

    filler.unlink()  # space comes back; no restart

    status, body = await api.call("POST", "/api/agents", json={"name": "big", "systemPrompt": "x" * 300_000})
    assert status == 201, body
    status, body = await api.call("POST", "/api/sessions", json={"agent": "helper", "systemPrompt": "y" * 999_000})
    assert status == 201, body
    if deleted:  # the final snapshot it owed is written now that there is room, late.txt in it
        async def final_snapshot() -> bool:
            return len(_snapshot_dir(data, s2)) > len(snapshots_before[s2])

        await _wait_for(final_snapshot, 30.0)  # the snapshot actor retries once it sees the room
        late = await _get(api, f"/api/sessions/{s2}/files/late.txt?format=json")
        assert "after the pause" in json.dumps(late), late
    else:
        status, body = await api.call("POST", f"/api/sessions/{s2}/stop")
        assert status == 200, body
    status, body = await api.call("POST", f"/api/sessions/{s1}/resume")
    assert status == 200, body
    assert (await send(api, s1, "after the disk was full"))[0] == 200
    messages, _ = await _history(api, s1)
    assert messages[: len(before[s1][0])] == before[s1][0]  # nothing stored before was lost
    users = [json.loads(m["content"])["content"] for m in messages if m["role"] == "user"]
    assert users == ["first words", "after the disk was full"]
    assert (await _get(api, "/health"))["dataDir"]["state"] == "ok"
    with sqlite3.connect(data / "ashd.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


class FrameReader:
    """SSE frames one at a time from a live response (frames may be megabytes long)."""

    def __init__(self, resp: ClientResponse) -> None:
        self.resp = resp
        self.buffer = ""

    async def next(self) -> Frame:
        while True:
            text = self.buffer.replace("\r\n", "\n")
            block, sep, rest = text.partition("\n\n")
            if sep:
                self.buffer = rest
                frames = parse_frames(block)
                if frames:
                    return frames[0]
                continue
            chunk = await self.resp.content.readany()
            assert chunk, "the stream ended before `done`"
            self.buffer += chunk.decode()


async def _gated_turn(api: Api, data: Path, fake: FakeModel, token: str) -> tuple[str, FrameReader, list[Frame]]:
    """Start a turn whose Bash tool waits for a file; fill the disk while it waits, then release it.
    The rest of the turn (a 3 MB answer) arrives with no room left to store it."""
    fake.script(token, [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": GATE, "timeout": 600_000}}]},
        {"content": [{"type": "text", "text": "Z" * 3_000_000}], "chunk": 1_000_000},
    ])
    await deploy(api)
    sid = (await create(api))["id"]
    assert (await send(api, sid, "a turn stored in full"))[0] == 200
    resp = await api.client.post(f"/api/sessions/{sid}/messages", json={"content": f"{token} go"},
                                 headers=api.headers())
    assert resp.status == 200
    reader = FrameReader(resp)
    frames = [await reader.next()]
    assert frames[0].data["message"]["content"][0]["type"] == "tool_use"
    fill(data)
    workspace = await api.server.components.local.registry.workspace("default", sid)  # type: ignore[union-attr]
    (workspace / "go").touch()  # an empty file needs no data block
    return sid, reader, frames


async def _rest(reader: FrameReader, frames: list[Frame]) -> list[Frame]:
    while frames[-1].event != "done":
        frames.append(await reader.next())
    return frames


async def test_disk_filling_mid_turn_loses_nothing_once_space_returns(
        disk: tuple[Api, Path], fake_model: FakeModel, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    api, data = disk
    caplog.set_level(logging.WARNING)
    sid, resp, frames = await _gated_turn(api, data, fake_model, "gate-returns")

    async def retrying() -> bool:
        return any("storing the end of a turn failed" in r.getMessage() for r in caplog.records)

    while frames[-1].data.get("type") != "result":
        frames.append(await resp.next())
    await _wait_for(retrying)  # the end of the turn waits: the disk is full
    (data / "filler.bin").unlink()
    frames = await _rest(resp, frames)

    assert [f.event for f in frames].count("error") == 0
    assert all(f.id is not None for f in frames)  # every frame, `done` included, is stored
    replay = parse_frames(await (await api.client.get(
        f"/api/sessions/{sid}/stream?after={(frames[0].id or 0) - 1}", headers=api.headers())).text())
    assert [(f.id, f.event, f.data) for f in replay] == [(f.id, f.event, f.data) for f in frames]
    messages = (await _get(api, f"/api/sessions/{sid}/messages?limit=1000"))["messages"]
    assert any("Z" * 1000 in m["content"] for m in messages)


@pytest.mark.parametrize("disk", [{"storage_retry_seconds": 0.5}], indirect=True)
async def test_disk_full_to_the_end_of_a_turn_says_which_frames_are_missing(
        disk: tuple[Api, Path], fake_model: FakeModel) -> None:  # noqa: F811
    api, data = disk
    sid, resp, frames = await _gated_turn(api, data, fake_model, "gate-stays-full")
    frames = await _rest(resp, frames)
    errors = [f for f in frames if f.event == "error"]
    assert len(errors) == 1 and errors[0].id is None
    assert "could not be stored" in errors[0].data["error"] and "missing" in errors[0].data["error"]
    assert frames[-1].event == "done" and frames[-1].id is None  # not claimed stored
    sent_ids = [f.id for f in frames if f.id is not None]

    (data / "filler.bin").unlink()
    stored = {e["sequence"] for e in (await _get(api, f"/api/sessions/{sid}/events?limit=1000"))["events"]}
    replay = parse_frames(await (await api.client.get(
        f"/api/sessions/{sid}/stream?after=0", headers=api.headers())).text())
    replayed = {f.id for f in replay}
    # What the error frame names is exactly what is missing; everything else is there.
    first, last = (int(x) for x in errors[0].data["error"].split("(ids ")[1].split(")")[0].split("-"))
    assert all((first <= i <= last) != (i in replayed) for i in sent_ids)
    assert stored  # the earlier turn is intact
    # and the session goes on once space is back
    status, after = await send(api, sid, "and now?")
    assert status == 200 and after[-1].event == "done" and after[-1].id is not None


@pytest.mark.parametrize("disk", [{"data_dir_min_free_mb": 24, "data_dir_warn_free_mb": 48}], indirect=True)
async def test_below_the_reserve_new_data_is_refused_but_work_under_way_is_saved(disk: tuple[Api, Path]) -> None:
    api, data = disk
    await deploy(api)
    s1 = (await create(api))["id"]
    assert (await send(api, s1, "before the reserve"))[0] == 200
    s2 = (await create(api))["id"]
    stored = (await _get(api, f"/api/sessions/{s1}/messages"))["messages"]
    filler = fill(data, leave=16 * MIB)  # free space now below the 24 MiB reserve, but not zero

    for method, path, body in (("POST", "/api/sessions", {"agent": "helper"}),
                               ("POST", f"/api/sessions/{s1}/messages", {"content": "more"}),
                               ("POST", "/api/agents", {"name": "other", "systemPrompt": "hi"}),
                               ("POST", "/api/credentials", {"type": "custom", "key": "k"})):
        status, reply = await api.call(method, path, json=body)
        assert status == 507 and "kept in reserve" in reply["error"], (path, reply)
    health = await _get(api, "/health")
    assert health["dataDir"]["state"] == "full" and health["dataDir"]["minFreeBytes"] == 24 * MIB
    # saving what exists is not refused: the reserve is there for it
    assert (await api.call("POST", f"/api/sessions/{s1}/pause"))[0] == 200
    assert (await api.call("POST", f"/api/sessions/{s2}/stop"))[0] == 200
    assert (await api.call("DELETE", f"/api/sessions/{s2}"))[0] == 200
    assert (await _get(api, f"/api/sessions/{s1}/messages"))["messages"] == stored

    filler.unlink()
    assert (await _get(api, "/health"))["dataDir"]["state"] == "ok"
    assert (await api.call("POST", f"/api/sessions/{s1}/resume"))[0] == 200
    assert (await send(api, s1, "after the reserve"))[0] == 200
