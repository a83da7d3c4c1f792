"""A sandbox can rename a directory of its workspace and put a link to a host path in its place at any
moment, while the server (root) lists, snapshots or reads that workspace. Here a thread plays the
sandbox, swapping a directory for a link to a host directory as fast as it can, while the server's
readers run: nothing of the host directory may ever be listed or read."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ashd.errors import NotFound
from ashd.storage._files import DirectoryReader, list_files
from ashd.storage._snapshots import snapshot_workspace

SECRET = b"HOST-SECRET-" * 100


# Swaps `d` (a directory) and `swap` (a link to the host directory) atomically (renameat2 with
# RENAME_EXCHANGE), as fast as it can: at any moment one of the two names is a link to the host.
SWAPPER = """
import ctypes, os, sys
ws, host = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
d, other = os.path.join(ws, "d").encode(), os.path.join(ws, "swap").encode()
os.symlink(host, other)
while True:
    libc.renameat2(-100, d, -100, other, 2)
"""
# Enough other entries that a reader takes a while between listing the workspace and opening `d`:
# without them the window is microseconds and the race is rarely won.
FILLER = 3000


@pytest.fixture
def raced(tmp_path: Path) -> Iterator[Path]:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "inside.txt").write_text("workspace data")
    host = tmp_path / "host"
    host.mkdir()
    (host / "inside.txt").write_bytes(SECRET)  # the same name: a path-based read would take it
    (host / "only-on-the-host.txt").write_bytes(SECRET)
    for i in range(FILLER):
        (ws / f"f{i:05}").write_text("x")
    # A process of its own, as a sandbox is: it swaps on the other core while the readers run.
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(ws), str(host)])
    while not (ws / "swap").is_symlink() and swapper.poll() is None:
        time.sleep(0.01)
    try:
        yield ws
    finally:
        swapper.kill()
        swapper.wait()


def test_listing_never_shows_a_host_directory(raced: Path) -> None:
    for _ in range(12):
        paths = {f.path for f in list_files(raced)}
        assert not any("only-on-the-host" in p for p in paths), paths


def test_reads_never_return_host_files(raced: Path) -> None:
    reader = DirectoryReader(raced)
    for _ in range(300):
        # NotFound: the directory was away at that moment; no file there is the right answer.
        with contextlib.suppress(NotFound):
            assert reader.read_for_json("d/inside.txt") == "workspace data"


def test_snapshots_never_contain_host_files(raced: Path, tmp_path: Path) -> None:
    for i in range(8):
        info = snapshot_workspace(raced, tmp_path / "snaps", "00000000-0000-0000-0000-000000000001", keep=1)
        with tarfile.open(info.path) as tf:
            for member in tf:
                assert "only-on-the-host" not in member.name, (i, member.name)
                if member.isreg():
                    data = tf.extractfile(member)
                    assert data is not None and SECRET[:12] not in data.read(), (i, member.name)
