"""`is_mounted` answers as `os.path.ismount` does, without its walk of every folder on the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ashd.sandboxing._disk import is_mounted


def _cases(tmp_path: Path) -> list[Path | str]:
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "to-proc").symlink_to("/proc")  # a symlink to a mount point is not one
    (tmp_path / "to-root").symlink_to("/")  # a symlinked folder on the way is followed
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return [
        "/", "/proc", "/proc/", "/sys", "/dev", "/etc", "/proc/self", "/proc/1",
        tmp_path, tmp_path / "plain", tmp_path / "file", tmp_path / "nowhere", tmp_path / "nowhere" / "deeper",
        tmp_path / "to-proc", tmp_path / "to-root", tmp_path / "to-root" / "proc", tmp_path / "to-root" / "etc",
        tmp_path / "dangling", tmp_path / "plain" / ".." / "plain", "proc", ".", "",
    ]


def test_it_agrees_with_ismount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # the relative cases: "proc" is a mount point from here, "." is /
    cases = _cases(tmp_path)
    answers = {str(c): (is_mounted(c), os.path.ismount(c)) for c in cases}
    assert {c: a for c, a in answers.items() if a[0] != a[1]} == {}
    assert answers["/proc"] == (True, True) and answers[str(tmp_path / "to-root" / "proc")] == (True, True)
    assert answers[str(tmp_path / "to-proc")] == (False, False)


def test_a_mount_inside_the_folder_is_seen(tmp_path: Path) -> None:
    """A real mount under a folder of ours (as a sandbox's disk is), found and then gone."""
    import ctypes
    import ctypes.util

    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    target = tmp_path / "sb" / "disk"
    target.mkdir(parents=True)
    assert not is_mounted(target)
    if libc.mount(b"ashd-test", os.fsencode(target), b"tmpfs", 0, b"size=1m") != 0:
        pytest.fail(f"mount: {os.strerror(ctypes.get_errno())}")
    try:
        assert is_mounted(target) and os.path.ismount(target)
    finally:
        assert libc.umount2(os.fsencode(target), 2) == 0  # MNT_DETACH
    assert not is_mounted(target)
