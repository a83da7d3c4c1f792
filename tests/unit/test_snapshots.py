"""Snapshots: atomic writes (a real crash mid-write), retention, restore round trip, safe extraction,
and reading files from a snapshot under the same rules as a workspace."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
from pathlib import Path

import pytest

from ashd.errors import BadRequest, NotFound, StorageError
from ashd.storage._files import list_files
from ashd.storage._snapshots import (
    PARTIAL_PREFIX,
    SnapshotTooLarge,
    check_fits,
    check_session_id,
    latest_local,
    list_keys,
    remove_stale_partials,
    restore_workspace,
    snapshot_workspace,
)
from ashd.storage._snapshots_reader import SnapshotReader
from tests.fixtures.files import write


def tree(root: Path) -> dict[str, bytes]:
    return {f.path: (root / f.path).read_bytes() for f in list_files(root)}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root, "AGENT.md", "# agent\n")
    write(root, "src/app.py", "print('hi')\n")
    write(root, "src/data/blob.bin", os.urandom(5000))
    write(root, "docs/ünïcode name.txt", "ü")
    (root / "empty_dir").mkdir()
    write(root, "node_modules/pkg/index.js", "x")
    write(root, ".git/HEAD", "ref")
    write(root, "src/__pycache__/app.cpython-311.pyc", b"\x00")
    write(root, "run/server.pid", "123")
    write(root, "yarn.lock", "lock")
    write(root, "tmp/scratch", "s")
    write(tmp_path / "outside", "secret.txt", "secret")
    (root / "escape.txt").symlink_to(tmp_path / "outside/secret.txt")
    (root / "escape_rel").symlink_to("../outside/secret.txt")
    (root / "app_link.py").symlink_to("src/app.py")
    (root / "src_alias").symlink_to("src", target_is_directory=True)
    os.mkfifo(root / "fifo")
    (root / "src/app.py").chmod(0o755)
    return root


def test_round_trip_restores_everything_but_the_exclusions(ws: Path, tmp_path: Path) -> None:
    info = snapshot_workspace(ws, tmp_path / "snaps" / "s1", "s1")

    assert info.session_id == "s1"
    assert info.path.parent == tmp_path / "snaps" / "s1"
    assert info.file_count == len(list_files(ws)) == 5
    assert info.size == info.path.stat().st_size

    dest = tmp_path / "restored"
    assert restore_workspace(info, dest) == 6  # 5 files + the directory link
    assert tree(dest) == tree(ws)
    assert (dest / "empty_dir").is_dir()
    assert os.readlink(dest / "app_link.py") == "src/app.py"
    assert (dest / "src_alias/app.py").read_text() == "print('hi')\n"
    assert os.stat(dest / "src/app.py").st_mode & 0o777 == 0o755
    for gone in ("node_modules", ".git", "src/__pycache__", "run/server.pid", "yarn.lock", "tmp",
                 "escape.txt", "escape_rel", "fifo"):
        assert not os.path.lexists(dest / gone), gone


def test_restore_into_an_existing_directory_replaces_same_named_files(ws: Path, tmp_path: Path) -> None:
    info = snapshot_workspace(ws, tmp_path / "snaps" / "s1", "s1")
    dest = tmp_path / "existing"
    write(dest, "AGENT.md", "old agent file")
    write(dest, "keep.txt", "not in the snapshot")

    restore_workspace(info.path, dest)

    assert (dest / "AGENT.md").read_text() == "# agent\n"
    assert (dest / "keep.txt").read_text() == "not in the snapshot"


def test_keeps_the_newest_n_and_latest_is_the_newest(ws: Path, tmp_path: Path) -> None:
    session_dir = tmp_path / "snaps" / "s1"
    infos = []
    for i in range(5):
        write(ws, "counter.txt", str(i))
        infos.append(snapshot_workspace(ws, session_dir, "s1", keep=3))

    assert list_keys(session_dir) == [i.key for i in infos[2:]]
    latest = latest_local(session_dir, "s1")
    assert latest == infos[-1]
    assert latest.created_at > infos[-2].created_at
    with SnapshotReader(latest.path) as reader:
        assert reader.read_for_json("counter.txt") == "4"


def test_missing_workspace_and_bad_session_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        snapshot_workspace(tmp_path / "nope", tmp_path / "snaps" / "s", "s")
    for bad in ("", "..", "a/b", "../x", ".hidden", "a\x00"):
        with pytest.raises(BadRequest):
            check_session_id(bad)


CRASH_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ashd.storage._snapshots import snapshot_workspace

    def pause(count: int) -> None:
        if count == int(sys.argv[4]):
            print("paused", flush=True)
            sys.stdin.read()  # block here, mid-write, until killed

    snapshot_workspace(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], on_progress=pause)
    print("finished", flush=True)
    """
)


def test_a_crash_mid_write_leaves_the_previous_snapshot_as_latest(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws, "version.txt", "old")
    session_dir = tmp_path / "snaps" / "s1"
    old = snapshot_workspace(ws, session_dir, "s1")
    old_bytes = old.path.read_bytes()

    # A big workspace of incompressible data, so the writer is well into the tar when it pauses.
    write(ws, "version.txt", "new")
    for i in range(200):
        write(ws, f"big/{i:03d}.bin", os.urandom(64 * 1024))

    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(ws), str(session_dir), "s1", "150"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert lines.get(timeout=60).strip() == "paused"
        partials = [p for p in os.listdir(session_dir) if p.startswith(PARTIAL_PREFIX)]
        assert len(partials) == 1
        assert (session_dir / partials[0]).stat().st_size > 1024 * 1024  # really mid-write
        assert latest_local(session_dir, "s1") == old
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    assert list_keys(session_dir) == [old.key]
    assert latest_local(session_dir, "s1") == old
    assert old.path.read_bytes() == old_bytes
    restored = tmp_path / "restored"
    restore_workspace(old, restored)
    assert tree(restored) == {"version.txt": b"old"}

    # The crashed writer's leftover is removed by the next start-up sweep, never read.
    remove_stale_partials(session_dir, older_than=0)
    assert os.listdir(session_dir) == [old.key]
    new = snapshot_workspace(ws, session_dir, "s1")
    assert latest_local(session_dir, "s1") == new
    assert new.file_count == 201


def _member(tf: tarfile.TarFile, name: str, *, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tf.addfile(info, io.BytesIO(data) if data else None)


def _malicious_tar(path: Path, outside: Path) -> None:
    with tarfile.open(path, "w:gz") as tf:
        _member(tf, "good.txt", data=b"fine")
        _member(tf, "../climb.txt", data=b"evil")
        _member(tf, "a/../../climb2.txt", data=b"evil")
        _member(tf, f"{outside}/abs.txt", data=b"evil")
        _member(tf, "to_outside", type=tarfile.SYMTYPE, linkname=str(outside))
        _member(tf, "to_outside/through_link.txt", data=b"evil")
        _member(tf, "rel_outside", type=tarfile.SYMTYPE, linkname="../outside")
        _member(tf, "hard", type=tarfile.LNKTYPE, linkname=str(outside / "target.txt"))
        _member(tf, "dev_null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        _member(tf, "pipe", type=tarfile.FIFOTYPE)
        _member(tf, "setuid.sh", data=b"#!/bin/sh\n", mode=0o4755)
        _member(tf, "node_modules/evil.js", data=b"x")


def test_restore_of_a_malicious_tar_stays_inside_the_destination(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "target.txt", "host file")
    evil = tmp_path / "evil.tar.gz"
    _malicious_tar(evil, outside)
    dest = tmp_path / "sandbox" / "workspace"

    restore_workspace(evil, dest)

    assert sorted(os.listdir(outside)) == ["target.txt"]
    assert (outside / "target.txt").read_text() == "host file"
    assert not (tmp_path / "sandbox" / "climb.txt").exists()
    assert not (tmp_path / "climb2.txt").exists()
    assert (dest / "good.txt").read_bytes() == b"fine"
    for refused in ("rel_outside", "hard", "dev_null", "pipe", "node_modules"):
        assert not os.path.lexists(dest / refused), refused
    # The link was refused; the member below it then lands in a plain directory inside dest.
    assert not (dest / "to_outside").is_symlink()
    assert not os.stat(dest / "setuid.sh").st_mode & 0o4000
    # The absolute member is made relative: it lands inside the destination, never outside.
    for root, _, names in os.walk(dest):
        for name in names:
            assert Path(root, name).resolve().is_relative_to(dest.resolve())


def test_reader_of_a_malicious_tar_serves_only_safe_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "target.txt", "host file")
    evil = tmp_path / "evil.tar.gz"
    _malicious_tar(evil, outside)

    with SnapshotReader(evil) as reader:
        assert [f.path for f in reader.list_files()] == ["good.txt", "setuid.sh"]
        for rel in ("to_outside/through_link.txt", "rel_outside", "hard", "node_modules/evil.js"):
            with pytest.raises(NotFound):
                reader.open_file(rel)
        with pytest.raises(BadRequest, match="not a regular file"):
            reader.open_file("dev_null")


def test_a_damaged_snapshot_is_a_storage_error(tmp_path: Path) -> None:
    bad = tmp_path / "00000000000000000001-1.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(StorageError, match="damaged"):
        restore_workspace(bad, tmp_path / "dest")
    with SnapshotReader(bad) as reader, pytest.raises(StorageError, match="cannot be read"):
        reader.list_files()


def test_reader_follows_the_workspace_rules(ws: Path, tmp_path: Path) -> None:
    write(ws, "big.txt", "a" * 3000)
    write(ws, "binary.bin", b"\xff\x00\xfe")
    info = snapshot_workspace(ws, tmp_path / "snaps" / "s1", "s1")
    reader = SnapshotReader(info.path)

    assert [(f.path, f.size) for f in reader.list_files()] == [(f.path, f.size) for f in list_files(ws)]
    assert [f.modified_at for f in reader.list_files()] == [
        f.modified_at.replace(microsecond=0) for f in list_files(ws)
    ]
    stream, size = reader.open_file("src/data/blob.bin")
    with stream:
        assert stream.read() == (ws / "src/data/blob.bin").read_bytes()
    assert size == 5000
    assert reader.read_for_json("app_link.py") == "print('hi')\n"
    assert reader.read_for_json("src_alias/app.py") == "print('hi')\n"
    assert reader.read_for_json("docs/ünïcode name.txt") == "ü"
    with pytest.raises(BadRequest, match="file is 3000 bytes"):
        reader.read_for_json("big.txt", limit=2048)
    with pytest.raises(BadRequest, match="binary"):
        reader.read_for_json("binary.bin")
    for rel in ("", "/etc/passwd", "../ws/AGENT.md", "src/../../x"):
        with pytest.raises(BadRequest):
            reader.open_file(rel)
    with pytest.raises(BadRequest, match="is a directory"):
        reader.open_file("src")
    for rel in ("missing.txt", "escape.txt", "node_modules/pkg/index.js", "yarn.lock"):
        with pytest.raises(NotFound):
            reader.open_file(rel)

    # The reader holds the snapshot open: pruning it does not break a request in flight.
    info.path.unlink()
    assert reader.read_for_json("AGENT.md") == "# agent\n"
    reader.close()
    with pytest.raises(StorageError, match="closed"):
        reader.open_file("AGENT.md")


def test_check_fits_says_when_a_bounded_walk_did_not_finish(tmp_path: Path) -> None:
    """A DELETE handled on the loop walks at most a few entries there (`check_fits(max_entries=)`):
    False when the tree is larger (then it is walked again on the actor's thread), True when the
    whole tree was counted; a tree over the limit within those entries is refused either way."""
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"x" * 100)
    assert check_fits(tmp_path, "s", 10_000, max_entries=10) is True
    assert check_fits(tmp_path, "s", 10_000, max_entries=9) is False
    assert check_fits(tmp_path, "s", 10_000) is True
    (tmp_path / "big").write_bytes(b"x" * 20_000)
    with pytest.raises(SnapshotTooLarge):
        check_fits(tmp_path, "s", 10_000)
    with pytest.raises(SnapshotTooLarge):  # "big" sorts first: found within the bound
        check_fits(tmp_path, "s", 10_000, max_entries=3)
