"""Snapshot stores against real storage: a local dir, a `file://` mount, and S3 (moto's server)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from ashd.errors import ConfigError, NotFound, StorageError
from ashd.storage._snapshots import PARTIAL_PREFIX, SnapshotInfo, snapshot_workspace
from ashd.storage._snapshots_reader import SnapshotReader
from ashd.storage._snapshots_stores import (
    FileSnapshotStore,
    LocalSnapshotStore,
    S3SnapshotStore,
    SnapshotStore,
    store_from_url,
)
from tests.fixtures.s3_fixture import S3Server, s3_bucket, s3_server  # noqa: F401

StoreFactory = Callable[[int], SnapshotStore]


@pytest.fixture(params=["local", "file", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "local":
        return lambda keep: LocalSnapshotStore(tmp_path / "data" / "snapshots", keep)
    if request.param == "file":
        return lambda keep: store_from_url(f"file://{tmp_path}/shared mount/snaps", keep)
    bucket = request.getfixturevalue("s3_bucket")
    return lambda keep: store_from_url(f"s3://{bucket}/team/snapshots", keep)


class Snapper:
    def __init__(self, tmp_path: Path) -> None:
        self.ws = tmp_path / "ws"
        self.staging = tmp_path / "staging"
        self.count = 0

    def take(self, session_id: str = "s1") -> SnapshotInfo:
        self.count += 1
        (self.ws / "src").mkdir(parents=True, exist_ok=True)
        (self.ws / "src" / "n.txt").write_text(str(self.count))
        return snapshot_workspace(self.ws, self.staging / session_id, session_id, keep=100)


def test_put_latest_get_delete(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(2)
    snap = Snapper(tmp_path)
    assert store.latest("s1") is None

    first = snap.take()
    assert store.put("s1", first.path) == first.key
    assert store.latest("s1") == first.key

    second, third = snap.take(), snap.take()
    store.put("s1", second.path)
    store.put("s1", third.path)
    assert store.latest("s1") == third.key

    dest = tmp_path / "cache" / "s1" / third.key
    store.get("s1", third.key, dest)
    assert dest.read_bytes() == third.path.read_bytes()
    assert not [p for p in os.listdir(dest.parent) if p.startswith(PARTIAL_PREFIX)]
    with SnapshotReader(dest) as reader:
        assert reader.read_for_json("src/n.txt") == "3"

    # keep=2: the first one was pruned from the store.
    with pytest.raises(NotFound):
        store.get("s1", first.key, tmp_path / "cache" / "s1" / first.key)
    store.get("s1", second.key, tmp_path / "cache" / "s1" / second.key)

    other = snap.take("s2")
    store.put("s2", other.path)
    store.delete_session("s1")
    assert store.latest("s1") is None
    assert store.latest("s2") == other.key
    store.delete_session("s1")  # nothing left: still fine


def test_a_file_not_named_by_a_key_is_refused(make_store: StoreFactory, tmp_path: Path) -> None:
    stray = tmp_path / "stray.tar.gz"
    stray.write_bytes(b"")
    with pytest.raises(StorageError, match="not a snapshot key"):
        make_store(3).put("s1", stray)


def test_s3_objects_live_under_the_prefix(s3_bucket: str, tmp_path: Path) -> None:  # noqa: F811
    store = store_from_url(f"s3://{s3_bucket}/pre/fix/")
    assert isinstance(store, S3SnapshotStore)
    info = Snapper(tmp_path).take("sess-1")
    store.put("sess-1", info.path)
    listed = boto3.session.Session().client("s3").list_objects_v2(Bucket=s3_bucket)
    assert [o["Key"] for o in listed["Contents"]] == [f"pre/fix/sess-1/{info.key}"]


def test_s3_errors_are_storage_errors(s3_bucket: str, tmp_path: Path) -> None:  # noqa: F811
    store = store_from_url(f"s3://{s3_bucket}-missing/x")
    info = Snapper(tmp_path).take()
    with pytest.raises(StorageError, match="cannot upload snapshot"):
        store.put("s1", info.path)
    with pytest.raises(StorageError, match="cannot list"):
        store.latest("s1")


def test_the_local_store_does_not_copy_a_snapshot_already_in_place(tmp_path: Path) -> None:
    store = LocalSnapshotStore(tmp_path / "snapshots")
    snap = Snapper(tmp_path)
    snap.staging = store.root
    info = snap.take()
    assert store.put("s1", info.path) == info.key
    assert os.listdir(store.session_dir("s1")) == [info.key]


def test_store_urls(tmp_path: Path) -> None:
    store = store_from_url(f"file://{tmp_path}/a%20b")
    assert isinstance(store, FileSnapshotStore)
    assert store.root == tmp_path / "a b"
    s3 = store_from_url("s3://bucket")
    assert isinstance(s3, S3SnapshotStore)
    assert (s3.bucket, s3.prefix) == ("bucket", "")
    for bad in ("http://x/y", "file://host/path", "s3:///nobucket"):
        with pytest.raises(ConfigError):
            store_from_url(bad)


def test_the_server_fixture_is_a_real_process(s3_server: S3Server) -> None:  # noqa: F811
    assert s3_server.process.poll() is None
    assert s3_server.endpoint.startswith("http://127.0.0.1:")
