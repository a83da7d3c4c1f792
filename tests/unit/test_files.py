"""Workspace file access: listing, exclusions, traversal, symlink escapes, limits, headers."""

from __future__ import annotations

import datetime as dt
import os
import socket
from pathlib import Path

import pytest

from ashd.errors import BadRequest, NotFound
from ashd.storage._files import (
    DirectoryReader,
    check_raw_size,
    content_disposition,
    list_files,
    mime_type,
    open_file,
    resolve_file,
)
from tests.fixtures.files import write


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


def test_lists_recursively_with_relative_posix_paths_sizes_and_utc_times(ws: Path) -> None:
    write(ws, "README.md", "hello")
    write(ws, "src/pkg/main.py", "print(1)\n")
    write(ws, ".hidden/config", "")
    os.utime(ws / "README.md", (1_700_000_000, 1_700_000_000))

    files = list_files(ws)

    assert [f.path for f in files] == [".hidden/config", "README.md", "src/pkg/main.py"]
    readme = files[1]
    assert readme.size == 5
    assert readme.modified_at == dt.datetime.fromtimestamp(1_700_000_000, dt.UTC)
    assert readme.to_json() == {"path": "README.md", "size": 5, "modifiedAt": "2023-11-14T22:13:20.000Z"}


def test_excludes_the_interface_directories_and_file_types(ws: Path) -> None:
    excluded_dirs = ["node_modules", ".git", "__pycache__", ".cache", ".npm", ".pnpm-store", ".yarn",
                     ".venv", "venv", ".tmp", "tmp"]
    for d in excluded_dirs:
        write(ws, f"{d}/inner/file.txt")
        write(ws, f"src/{d}/nested.txt")
    for name in ("a.sock", "yarn.lock", "server.pid"):
        write(ws, f"src/{name}")
    write(ws, "src/keep.lockfile")
    write(ws, "src/tmpfile.txt")
    write(ws, "venvs/kept.txt")

    assert [f.path for f in list_files(ws)] == ["src/keep.lockfile", "src/tmpfile.txt", "venvs/kept.txt"]


def test_skips_sockets_fifos_and_symlinks_that_escape(ws: Path, tmp_path: Path) -> None:
    outside = write(tmp_path, "outside/secret.txt", "secret")
    write(ws, "real.txt", "inside")
    os.mkfifo(ws / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "s"))
    try:
        (ws / "escape").symlink_to(outside)
        (ws / "escape_dir").symlink_to(outside.parent, target_is_directory=True)
        (ws / "relative_escape").symlink_to("../outside/secret.txt")
        (ws / "dangling").symlink_to("nope.txt")
        (ws / "alias.txt").symlink_to("real.txt")
        (ws / "dir_alias").symlink_to(ws, target_is_directory=True)  # a loop if followed

        files = {f.path: f.size for f in list_files(ws)}
    finally:
        sock.close()

    assert files == {"alias.txt": 6, "real.txt": 6}


def test_listing_stops_at_the_entry_bound(ws: Path) -> None:
    for i in range(30):
        write(ws, f"f{i:02d}")
    assert len(list_files(ws, max_entries=10)) == 10


@pytest.mark.parametrize(
    "rel",
    ["", "/etc/passwd", "../x", "a/../../x", "a/..", "..", "a\x00b", ".", "./"],
)
def test_resolve_refuses_bad_paths_with_400(ws: Path, rel: str) -> None:
    write(ws, "a/file")
    with pytest.raises(BadRequest):
        resolve_file(ws, rel)


def test_resolve_directory_is_400_and_missing_is_404(ws: Path) -> None:
    write(ws, "dir/file", "x")
    with pytest.raises(BadRequest, match="is a directory"):
        resolve_file(ws, "dir")
    with pytest.raises(NotFound, match="missing.txt"):
        resolve_file(ws, "missing.txt")
    with pytest.raises(NotFound):
        resolve_file(ws, "dir/file/below")


def test_resolve_follows_links_inside_but_refuses_escapes_as_404(ws: Path, tmp_path: Path) -> None:
    write(ws, "src/a.py", "A")
    outside = write(tmp_path, "host/secret", "S")
    (ws / "link.py").symlink_to("src/a.py")
    (ws / "srcdir").symlink_to("src", target_is_directory=True)
    (ws / "escape").symlink_to(outside)
    (ws / "hostdir").symlink_to(outside.parent, target_is_directory=True)

    assert resolve_file(ws, "link.py") == (ws / "src/a.py").resolve()
    assert resolve_file(ws, "srcdir/a.py") == (ws / "src/a.py").resolve()
    for rel in ("escape", "hostdir/secret"):
        with pytest.raises(NotFound, match="outside"):
            resolve_file(ws, rel)


def test_resolve_refuses_a_fifo_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    with pytest.raises(BadRequest, match="not a regular file"):
        resolve_file(ws, "pipe")


def test_open_file_returns_bytes_and_size(ws: Path) -> None:
    write(ws, "data.bin", b"\x00\x01\x02")
    fh, size = open_file(ws, "data.bin")
    with fh:
        assert (fh.read(), size) == (b"\x00\x01\x02", 3)


def test_read_for_json_limits_and_binary(ws: Path) -> None:
    write(ws, "t.txt", "héllo")
    write(ws, "big.txt", b"a" * 2049)
    write(ws, "b.bin", b"\xff\xfe\x00")
    reader = DirectoryReader(ws)

    assert reader.read_for_json("t.txt") == "héllo"
    assert reader.read_for_json("big.txt", limit=4096) == "a" * 2049
    with pytest.raises(BadRequest, match=r"file is 2049 bytes; format=json is limited to .*use format=raw"):
        reader.read_for_json("big.txt", limit=2048)
    with pytest.raises(BadRequest, match=r"binary.*use format=raw"):
        reader.read_for_json("b.bin")


def test_default_json_limit_is_one_megabyte(ws: Path) -> None:
    write(ws, "over.txt", b"a" * (1024 * 1024 + 1))
    with pytest.raises(BadRequest, match="limited to 1 MB"):
        DirectoryReader(ws).read_for_json("over.txt")


def test_raw_size_check() -> None:
    check_raw_size(100 * 1024 * 1024)
    with pytest.raises(BadRequest, match="limited to 100 MB"):
        check_raw_size(100 * 1024 * 1024 + 1)


def test_mime_type_by_extension_with_fallback() -> None:
    assert mime_type("src/app.py") == "text/x-python"
    assert mime_type("index.html") == "text/html"
    assert mime_type("data.json") == "application/json"
    assert mime_type("blob.unknownext") == "application/octet-stream"
    assert mime_type("Makefile") == "application/octet-stream"


def test_content_disposition_is_the_interfaces_rfc5987_value_alone() -> None:
    assert content_disposition("dir/report.txt") == "attachment; filename*=UTF-8''report.txt"
    assert content_disposition('résumé "final";.pdf') == (
        "attachment; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22%3B.pdf")


def test_directory_reader_is_the_same_file_source_as_a_snapshot(ws: Path, tmp_path: Path) -> None:
    from ashd.storage._files import DirectoryReader, FileSource
    from ashd.storage._snapshots import snapshot_workspace
    from ashd.storage._snapshots_reader import SnapshotReader

    write(ws, "a.txt", "A")
    write(ws, "b/c.bin", b"\xff")
    (ws / "escape").symlink_to(tmp_path)
    info = snapshot_workspace(ws, tmp_path / "snaps" / "s", "s")
    sources: list[FileSource] = [DirectoryReader(ws), SnapshotReader(info.path)]
    for source in sources:
        assert [f.path for f in source.list_files()] == ["a.txt", "b/c.bin"]
        assert source.read_for_json("a.txt") == "A"
        stream, size = source.open_file("b/c.bin")
        with stream:
            assert (stream.read(), size) == (b"\xff", 1)
        with pytest.raises(BadRequest, match="binary"):
            source.read_for_json("b/c.bin")
        with pytest.raises(BadRequest, match="directory"):
            source.open_file("b")
        with pytest.raises(BadRequest, match=r"\.\."):
            source.open_file("b/../a.txt")
        with pytest.raises(NotFound):
            source.open_file("escape/x")


def test_json_limit_is_inclusive_on_every_source(ws: Path, tmp_path: Path) -> None:
    from ashd.storage._files import DirectoryReader
    from ashd.storage._snapshots import snapshot_workspace
    from ashd.storage._snapshots_reader import SnapshotReader

    write(ws, "exact.txt", b"a" * 2048)  # exactly the limit: served
    write(ws, "over.txt", b"a" * 2049)  # one byte more: refused with the size
    info = snapshot_workspace(ws, tmp_path / "snaps" / "s", "s")
    for source in (DirectoryReader(ws), SnapshotReader(info.path)):
        assert source.read_for_json("exact.txt", limit=2048) == "a" * 2048
        with pytest.raises(BadRequest, match="file is 2049 bytes"):
            source.read_for_json("over.txt", limit=2048)


def test_json_read_stops_at_the_limit_whatever_the_size_said() -> None:
    import tracemalloc

    from ashd.storage._files import DirectoryReader

    # A file whose size says 0 but holds hundreds of KB (as a file growing after the size check
    # would): the read must stop at the limit, not load the whole file into memory.
    smaps = Path("/proc/self/smaps")
    assert smaps.stat().st_size == 0 and len(smaps.read_bytes()) > 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(BadRequest, match="file is 4097 bytes"):
            DirectoryReader(smaps.parent).read_for_json(smaps.name, limit=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024


def test_a_link_into_an_excluded_directory_is_neither_listed_nor_a_loophole(ws: Path) -> None:
    write(ws, "node_modules/pkg/secret.txt", "hidden")
    write(ws, ".git/config", "hidden")
    write(ws, "kept.txt", "kept")
    (ws / "via_link.txt").symlink_to("node_modules/pkg/secret.txt")
    (ws / "git_config").symlink_to(ws / ".git" / "config")
    (ws / "kept_alias.txt").symlink_to("kept.txt")
    write(ws, "src/node_modules/lib.js", "hidden")
    (ws / "nested_link.js").symlink_to("src/node_modules/lib.js")  # excluded below the top too
    assert [f.path for f in list_files(ws)] == ["kept.txt", "kept_alias.txt"]


def test_a_directory_swapped_for_a_link_while_opening_never_serves_outside(ws: Path, tmp_path: Path) -> None:
    import ctypes
    import threading

    # A sandboxed process can swap a path component for a symlink at any moment: between the
    # path's resolution and its open, `d` becomes a link to a directory outside the workspace.
    write(ws, "d/f.txt", "inside")
    write(tmp_path, "outside/f.txt", "OUTSIDE")
    real, link = ws / "d", ws / "d.link"
    link.symlink_to(tmp_path / "outside", target_is_directory=True)
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    stop = threading.Event()

    def swap() -> None:  # atomically exchange the directory and the link, again and again
        while not stop.is_set():
            if libc.renameat2(at_fdcwd, bytes(real), at_fdcwd, bytes(link), rename_exchange) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")

    swapper = threading.Thread(target=swap)
    swapper.start()
    served: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                fh, _size = open_file(ws, "d/f.txt")
            except (NotFound, BadRequest):
                served["refused"] = served.get("refused", 0) + 1
                continue
            with fh:
                text = fh.read().decode()
            served[text] = served.get(text, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert "OUTSIDE" not in served, served
    assert served.get("inside", 0) > 0, served


def test_a_link_to_a_sibling_that_sorts_after_the_workspace_is_outside(ws: Path, tmp_path: Path) -> None:
    # "ws-other" and "wt" sort after "ws": inside-ness is a path relation, never a string order.
    for sibling in ("ws-other", "wt"):
        write(tmp_path, f"{sibling}/secret.txt", "outside")
        (ws / f"to-{sibling}.txt").symlink_to(tmp_path / sibling / "secret.txt")
        (ws / f"dir-{sibling}").symlink_to(tmp_path / sibling, target_is_directory=True)
        with pytest.raises(NotFound):
            resolve_file(ws, f"to-{sibling}.txt")
        with pytest.raises(NotFound):
            open_file(ws, f"dir-{sibling}/secret.txt")
    write(ws, "inside.txt", "in")
    assert [f.path for f in list_files(ws)] == ["inside.txt"]


def test_the_header_percent_encodes_spaces_and_controls_and_has_no_other_parameter() -> None:
    assert content_disposition("a b~\x7f\x1f.txt") == "attachment; filename*=UTF-8''a%20b~%7F%1F.txt"


def test_a_limit_that_is_not_whole_megabytes_is_named_in_bytes(ws: Path) -> None:
    from ashd.storage._files import DirectoryReader

    write(ws, "over.txt", b"a" * 3000)
    with pytest.raises(BadRequest, match="limited to 2048 bytes, use format=raw"):
        DirectoryReader(ws).read_for_json("over.txt", limit=2048)
    with pytest.raises(BadRequest, match="limited to 1 MB"):
        check_raw_size(1024 * 1024 + 1, limit=1024 * 1024)


def test_excluded_names_are_files_too_at_any_depth(ws: Path) -> None:
    write(ws, "src/.git", "gitdir: ../.git/worktrees/src")  # a worktree's .git is a file
    write(ws, "src/app.pid", "42")
    write(ws, "src/main.py", "print()")
    assert [f.path for f in list_files(ws)] == ["src/main.py"]


def test_a_file_vanishing_while_it_is_opened_is_not_found_never_an_os_error(ws: Path) -> None:
    import threading

    # The sandbox removes and recreates its files at any moment; whichever step of the open the
    # removal lands on, the answer is 404, never an unexpected error (a 500).
    write(ws, "f.txt", "data")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            os.rename(ws / "f.txt", ws / "g.txt")
            os.rename(ws / "g.txt", ws / "f.txt")

    churner = threading.Thread(target=churn)
    churner.start()
    outcomes: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                fh, _size = open_file(ws, "f.txt")
                fh.close()
                outcome = "served"
            except NotFound:
                outcome = "not found"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        stop.set()
        churner.join()
    assert set(outcomes) == {"served", "not found"}, outcomes
