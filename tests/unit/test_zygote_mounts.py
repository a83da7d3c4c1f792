"""The fork server's own mount namespace: which mounts it leaves out (`private_mount_namespace`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ashd.zygote import _child


def test_mount_points_are_read_with_their_escapes_undone() -> None:
    assert _child._unescape_mountinfo(r"/srv/data\040dir/sandboxes\011x\134y") == "/srv/data dir/sandboxes\tx\\y"


def test_mounts_below_the_folders_and_any_servers_sandbox_disks_deepest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "mountinfo"
    table.write_text("".join(f"{i} 1 0:1 / {point} rw - tmpfs tmpfs rw\n" for i, point in enumerate([
        "/", "/srv/data/sandboxes", "/srv/data/sandboxes/a/disk", r"/srv/data/sandboxes/b\040c/disk",
        "/srv/data/sandboxes-old/x", "/run/netns", "/run/netns/ashd-1", "/srv/data/sandboxes/a/disk/deeper",
        "/other/data/sandboxes/sb-0123456789abcdef/disk", "/mnt/sb-0123456789abcdef/disk-old", "/mnt/sb-x/disk"])))
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        table if path == "/proc/self/mountinfo" else path, *a, **k))
    assert _child.mount_points_under(["/srv/data/sandboxes/", "/run/netns"]) == [
        "/other/data/sandboxes/sb-0123456789abcdef/disk", "/srv/data/sandboxes/a/disk/deeper",
        "/srv/data/sandboxes/b c/disk", "/srv/data/sandboxes/a/disk", "/run/netns/ashd-1"]
