"""A workspace's fingerprint changes with every change a snapshot would see, and is withheld while
an entry is too recent to be told apart from a later change (ashd/storage/_fingerprint.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ashd.storage._fingerprint import MIN_SETTLE_NS, SETTLE_NS, settle_ns_for, workspace_fingerprint


def tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print(1)\n")
    (root / "notes.md").write_text("notes\n")
    os.symlink("notes.md", root / "link")
    return root


def fp(root: Path) -> bytes:
    value = workspace_fingerprint(root, settle_ns=0)
    assert value is not None
    return value


def _same_size_rewrite(root: Path) -> None:
    (root / "src" / "main.py").write_text("print(2)\n")  # same size, same name: only the times differ


def _add(root: Path) -> None:
    (root / "src" / "b.py").write_text("")


def _rename(root: Path) -> None:
    (root / "notes.md").rename(root / "notes2.md")


def _retarget(root: Path) -> None:
    os.unlink(root / "link")
    os.symlink("src", root / "link")


def _replace(root: Path) -> None:
    (root / "new").write_text("notes\n")
    os.replace(root / "new", root / "notes.md")  # same content, another inode


CHANGES: dict[str, Callable[[Path], None]] = {
    "a file rewritten with the same size": _same_size_rewrite,
    "a file added": _add,
    "a file removed": lambda r: (r / "notes.md").unlink(),
    "a file renamed": _rename,
    "a file replaced by one with the same content": _replace,
    "a mode changed": lambda r: (r / "notes.md").chmod(0o600),
    "an empty directory added": lambda r: (r / "src" / "empty").mkdir(),
    "a symlink retargeted": _retarget,
    "a file truncated": lambda r: os.truncate(r / "src" / "main.py", 0),
}


def test_an_unchanged_tree_has_the_same_fingerprint(tmp_path: Path) -> None:
    root = tree(tmp_path / "ws")
    first = fp(root)
    os.stat(root / "notes.md")  # reading changes nothing
    (root / "notes.md").read_bytes()
    assert fp(root) == first


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_every_change_a_snapshot_would_see_changes_it(tmp_path: Path, change: str) -> None:
    root = tree(tmp_path / "ws")
    before = fp(root)
    CHANGES[change](root)
    assert fp(root) != before


def test_the_same_tree_elsewhere_is_another_tree(tmp_path: Path) -> None:
    assert fp(tree(tmp_path / "a")) != fp(tree(tmp_path / "b"))


def test_no_fingerprint_while_an_entry_is_newer_than_the_settling_time(tmp_path: Path) -> None:
    root = tree(tmp_path / "ws")
    assert workspace_fingerprint(root, settle_ns=3600 * 10**9) is None  # everything was just written
    old = 1_000_000_000
    for path in (root / "src" / "main.py", root / "notes.md", root / "src", root):
        os.utime(path, ns=(old, old), follow_symlinks=False)
    # utime sets mtime, never ctime (the kernel stamps that): still too recent
    assert workspace_fingerprint(root, settle_ns=3600 * 10**9) is None


def test_no_fingerprint_of_what_is_not_a_readable_directory(tmp_path: Path) -> None:
    assert workspace_fingerprint(tmp_path / "missing", settle_ns=0) is None
    (tmp_path / "file").write_text("x")
    assert workspace_fingerprint(tmp_path / "file", settle_ns=0) is None


def test_the_settling_time_is_ten_ticks_and_never_below_the_floor(tmp_path: Path) -> None:
    settle = settle_ns_for(tmp_path)
    assert MIN_SETTLE_NS <= settle <= SETTLE_NS * 10
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    assert settle_ns_for(tmp_path / "missing") == SETTLE_NS


def test_what_a_snapshot_leaves_out_is_left_out(tmp_path: Path) -> None:
    """Excluded directories are not listed (a large node_modules costs nothing), and a link to a
    directory outside is not followed: a sandbox cannot make the server walk the host's disk."""
    root = tree(tmp_path / "ws")
    (root / "node_modules" / "dep").mkdir(parents=True)
    (root / "node_modules" / "dep" / "index.js").write_text("a")
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink(outside, root / "escape")
    before = fp(root)
    (root / "node_modules" / "dep" / "index.js").write_text("bb")
    (outside / "secret").write_text("changed")
    (outside / "more").write_text("m")
    assert fp(root) == before
