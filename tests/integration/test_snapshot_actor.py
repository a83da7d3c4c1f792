"""SnapshotActor end to end: real workspace dirs, real tars, a file:// mount and a real S3 server."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from ashd.actors._activity import Activity
from ashd.actors._aio import call, stop_actor
from ashd.actors._owed import OwedSnapshots
from ashd.actors._snapshot import SnapshotActor, SnapshotProxy, snapshot_proxy
from ashd.errors import NotFound
from ashd.storage._files import list_files
from ashd.storage._fingerprint import settle_ns_for, workspace_fingerprint
from ashd.storage._snapshots_stores import SnapshotStore, store_from_url
from tests.fixtures.s3_fixture import s3_bucket, s3_server  # noqa: F401
from tests.fixtures.small_fs import fill, small_fs

TIMEOUT = 60.0


def make_workspace(root: Path, marker: str) -> Path:
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "main.py").write_text(f"print({marker!r})\n")
    (root / "notes.md").write_text("# notes\n")
    (root / "node_modules" / "dep").mkdir(parents=True, exist_ok=True)
    (root / "node_modules" / "dep" / "index.js").write_text("x")
    return root


def start(data: Path, remote: SnapshotStore | None = None) -> SnapshotProxy:
    return snapshot_proxy(SnapshotActor.start(data / "snapshots", remote, keep=2))


async def test_snapshot_latest_reader_restore_delete_from_asyncio(tmp_path: Path) -> None:
    actor = start(tmp_path / "data")
    ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "one")

    info = await call(actor.snapshot("s1", ws), TIMEOUT)
    assert info.path.parent == tmp_path / "data" / "snapshots" / "s1"
    assert info.file_count == 2
    assert await call(actor.latest("s1"), TIMEOUT) == info
    assert await call(actor.latest("unknown"), TIMEOUT) is None

    reader = await call(actor.reader("s1"), TIMEOUT)
    assert reader is not None
    with reader:
        assert [f.path for f in reader.list_files()] == ["notes.md", "src/main.py"]

    dest = tmp_path / "sandboxes" / "y" / "workspace"
    assert await call(actor.restore("s1", dest), TIMEOUT) is True
    assert (dest / "src" / "main.py").read_text() == "print('one')\n"
    assert not (dest / "node_modules").exists()
    assert await call(actor.restore("unknown", tmp_path / "z"), TIMEOUT) is False
    assert await call(actor.reader("unknown"), TIMEOUT) is None

    await call(actor.delete("s1"), TIMEOUT)
    assert await call(actor.latest("s1"), TIMEOUT) is None
    assert not (tmp_path / "data" / "snapshots" / "s1").exists()


async def test_errors_reach_the_caller(tmp_path: Path) -> None:
    actor = start(tmp_path / "data")
    with pytest.raises(NotFound, match="does not exist"):
        await call(actor.snapshot("s1", tmp_path / "no-workspace"), TIMEOUT)
    assert await call(actor.latest("s1"), TIMEOUT) is None  # the actor lives on


def test_start_up_removes_partials_left_by_a_crash(tmp_path: Path) -> None:
    session_dir = tmp_path / "data" / "snapshots" / "s1"
    session_dir.mkdir(parents=True)
    (session_dir / ".partial-abc.tar.gz").write_bytes(b"half")
    actor = start(tmp_path / "data")
    assert actor.latest("s1").get(timeout=TIMEOUT) is None
    assert os.listdir(session_dir) == []


def test_cross_runner_resume_through_a_shared_mount(tmp_path: Path) -> None:
    shared = f"file://{tmp_path}/shared"
    runner_a = start(tmp_path / "a", store_from_url(shared))
    runner_b = start(tmp_path / "b", store_from_url(shared))
    ws_a = make_workspace(tmp_path / "ws_a", "from a")

    first = runner_a.snapshot("s1", ws_a).get(timeout=TIMEOUT)

    # B never saw the session: it downloads the snapshot into its own local cache.
    on_b = runner_b.latest("s1").get(timeout=TIMEOUT)
    assert on_b is not None
    assert (on_b.key, on_b.path.parent) == (first.key, tmp_path / "b" / "snapshots" / "s1")
    ws_b = tmp_path / "ws_b"
    assert runner_b.restore("s1", ws_b).get(timeout=TIMEOUT) is True
    assert (ws_b / "src" / "main.py").read_text() == "print('from a')\n"

    # The session runs on B and is snapshotted there; back on A, the newer remote one wins.
    (ws_b / "src" / "main.py").write_text("print('from b')\n")
    newer = runner_b.snapshot("s1", ws_b).get(timeout=TIMEOUT)
    back_on_a = runner_a.latest("s1").get(timeout=TIMEOUT)
    assert back_on_a is not None
    assert back_on_a.key == newer.key
    ws_a2 = tmp_path / "ws_a2"
    runner_a.restore("s1", ws_a2).get(timeout=TIMEOUT)
    assert (ws_a2 / "src" / "main.py").read_text() == "print('from b')\n"
    assert [f.path for f in list_files(ws_a2)] == ["notes.md", "src/main.py"]


def test_s3_upload_failure_keeps_the_local_snapshot_and_retries(
    s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    bucket = f"{s3_bucket}-late"  # does not exist yet: every upload fails
    remote = store_from_url(f"s3://{bucket}/snaps")
    actor = start(tmp_path / "data", remote)
    ws = make_workspace(tmp_path / "ws", "v1")

    with caplog.at_level(logging.WARNING, logger="ashd.actors._snapshot"):
        info = actor.snapshot("s1", ws).get(timeout=TIMEOUT)
    assert info.path.is_file()
    assert any("upload failed" in r.getMessage() for r in caplog.records)
    assert actor.pending_uploads().get(timeout=TIMEOUT) == {"s1": info.key}
    # The remote is down, the local snapshot still answers.
    assert actor.latest("s1").get(timeout=TIMEOUT) == info
    assert actor.retry_uploads().get(timeout=TIMEOUT) == 1

    boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
    assert actor.retry_uploads().get(timeout=TIMEOUT) == 0
    assert actor.pending_uploads().get(timeout=TIMEOUT) == {}
    assert remote.latest("s1") == info.key

    # Another runner with an empty cache gets it from S3.
    other = start(tmp_path / "other", store_from_url(f"s3://{bucket}/snaps"))
    assert other.restore("s1", tmp_path / "restored").get(timeout=TIMEOUT) is True
    assert (tmp_path / "restored" / "src" / "main.py").read_text() == "print('v1')\n"

    actor.delete("s1").get(timeout=TIMEOUT)
    assert remote.latest("s1") is None
    assert other.latest("s1").get(timeout=TIMEOUT) is not None  # other's local cache is its own


async def test_an_unchanged_workspace_is_not_snapshotted_again(tmp_path: Path) -> None:
    """A pause, a resume and a DELETE with nothing changed between: the first snapshot holds the tree,
    so the later ones answer with it and write nothing; any change makes a new one."""
    actor = start(tmp_path / "data")
    ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "one")
    settle = settle_ns_for(tmp_path / "data")
    deadline = time.monotonic() + 30
    while workspace_fingerprint(ws, settle) is None:  # until the tree is older than the settling time
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    first = await call(actor.snapshot("s1", ws), TIMEOUT)
    again = await call(actor.snapshot("s1", ws), TIMEOUT)
    assert again == first
    assert sorted(p.name for p in first.path.parent.iterdir()) == [first.path.name]

    (ws / "src" / "main.py").write_text("print('two')")  # a change, and too recent to fingerprint
    second = await call(actor.snapshot("s1", ws), TIMEOUT)
    assert second.key != first.key
    reader = await call(actor.reader("s1"), TIMEOUT)
    assert reader is not None
    with reader:
        assert reader.read_for_json("src/main.py") == "print('two')"
    # No fingerprint was kept for a tree that was too recent: the next snapshot is taken again.
    third = await call(actor.snapshot("s1", ws), TIMEOUT)
    assert third.key != second.key

    await call(actor.delete("s1"), TIMEOUT)  # what is deleted is not answered with afterwards
    fourth = await call(actor.snapshot("s1", ws), TIMEOUT)
    assert fourth.path.is_file() and fourth.key not in (first.key, second.key, third.key)


def _keys(data: Path, session_id: str) -> list[str]:
    directory = data / "snapshots" / session_id
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


async def test_a_pause_snapshot_waits_for_a_quiet_moment_but_never_behind_a_read(tmp_path: Path) -> None:
    """`snapshot_soon` (a pause's): not taken while requests are in flight; taken at once when
    anything else about that session is asked first (a read sees it, a restore restores it); taken
    when the front end goes quiet; dropped by a delete; taken by a stopping actor."""
    activity = Activity(quiet_s=0.005, at_most_s=3600, loop=asyncio.get_running_loop())  # never the bound
    data = tmp_path / "data"
    ref = SnapshotActor.start(data / "snapshots", keep=5, owed=OwedSnapshots(activity))
    actor = snapshot_proxy(ref)
    ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "paused")
    activity.begin()  # a request in flight

    await call(actor.snapshot_soon("s1", ws), TIMEOUT)
    await asyncio.sleep(0.1)
    assert _keys(data, "s1") == []  # owed, not taken: the front end is busy
    reader = await call(actor.reader("s1"), TIMEOUT)  # ... but a read of the session takes it first
    assert reader is not None
    with reader:
        assert reader.read_for_json("src/main.py") == "print('paused')\n"
    assert len(_keys(data, "s1")) == 1

    (ws / "src" / "main.py").write_text("print('restored')\n")
    await call(actor.snapshot_soon("s1", ws), TIMEOUT)
    dest = tmp_path / "sandboxes" / "y" / "workspace"
    assert await call(actor.restore("s1", dest), TIMEOUT) is True  # a cold resume gets the owed state
    assert (dest / "src" / "main.py").read_text() == "print('restored')\n"

    ws2 = make_workspace(tmp_path / "sandboxes" / "z" / "workspace", "gone")
    await call(actor.snapshot_soon("s2", ws2), TIMEOUT)
    await call(actor.delete("s2"), TIMEOUT)  # a purge: what was owed is not taken afterwards

    ws3 = make_workspace(tmp_path / "sandboxes" / "q" / "workspace", "quiet")
    await call(actor.snapshot_soon("s3", ws3), TIMEOUT)
    activity.end()  # quiet from now on
    deadline = time.monotonic() + TIMEOUT
    while not _keys(data, "s3"):
        assert time.monotonic() < deadline, "an owed snapshot was never taken once the front end was quiet"
        await asyncio.sleep(0.01)
    assert _keys(data, "s2") == []

    activity.begin()
    ws4 = make_workspace(tmp_path / "sandboxes" / "w" / "workspace", "stopping")
    await call(actor.snapshot_soon("s4", ws4), TIMEOUT)
    await stop_actor(ref, TIMEOUT)  # a server that stops still stores what its pauses promised
    assert len(_keys(data, "s4")) == 1


async def test_without_an_activity_a_pause_snapshot_is_taken_at_once(tmp_path: Path) -> None:
    actor = start(tmp_path / "data")
    ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "now")
    await call(actor.snapshot_soon("s1", ws), TIMEOUT)
    assert len(_keys(tmp_path / "data", "s1")) == 1
    await call(actor.snapshot_soon("s1", tmp_path / "no-workspace"), TIMEOUT)  # logged, not raised
    assert len(_keys(tmp_path / "data", "s1")) == 1


async def test_a_snapshot_owed_from_another_thread_is_taken_in_the_next_quiet_moment(tmp_path: Path) -> None:
    """What a session actor does: owe it directly (`OwedSnapshots.add`, no message to the actor),
    with a future that is told when it is stored."""
    import concurrent.futures

    activity = Activity(quiet_s=0.005, at_most_s=3600, loop=asyncio.get_running_loop())
    owed = OwedSnapshots(activity)
    data = tmp_path / "data"
    ref = SnapshotActor.start(data / "snapshots", keep=5, owed=owed)
    try:
        ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "owed")
        taken: concurrent.futures.Future[Any] = concurrent.futures.Future()
        activity.begin()
        await asyncio.to_thread(owed.add, "s1", ws, taken)
        await asyncio.sleep(0.1)
        assert not taken.done() and _keys(data, "s1") == []
        activity.end()
        info = await asyncio.wait_for(asyncio.wrap_future(taken), TIMEOUT)
        assert info is not None and _keys(data, "s1") == [info.path.name]
    finally:
        await stop_actor(ref, TIMEOUT)


async def test_a_snapshot_a_full_disk_refused_is_taken_once_there_is_room(tmp_path: Path) -> None:
    """A DELETE's final snapshot (its sandbox waits for it) met a full data disk: it stays owed and
    is written as soon as the operator frees space, not on the retry timer (an hour here)."""
    import concurrent.futures

    with small_fs(tmp_path / "data", 16) as data:
        owed = OwedSnapshots(None)
        ref = SnapshotActor.start(data / "snapshots", keep=5, owed=owed, retry_seconds=3600)
        try:
            ws = make_workspace(tmp_path / "sandboxes" / "x" / "workspace", "final")
            (ws / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # incompressible: needs room
            filler = fill(data)
            taken: concurrent.futures.Future[Any] = concurrent.futures.Future()
            await asyncio.to_thread(owed.add, "s1", ws, taken)
            await asyncio.sleep(1.5)
            assert not taken.done() and _keys(data, "s1") == []  # refused, owed still, no partial left
            assert owed.sessions() == ["s1"]
            filler.unlink()
            info = await asyncio.wait_for(asyncio.wrap_future(taken), TIMEOUT)
            assert info is not None and _keys(data, "s1") == [info.path.name]
            assert owed.sessions() == []
        finally:
            await stop_actor(ref, TIMEOUT)
