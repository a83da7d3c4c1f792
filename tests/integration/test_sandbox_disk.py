"""The sandbox disk quota on both launch routes: a loop-mounted ext4 image per sandbox that the
kernel enforces, everything writable inside on it, no loop device or mount left behind, the image
mountable again for the start-up rescue, and preallocation that refuses what the data disk lacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ashd.errors import CapacityError, SandboxError
from ashd.sandboxing import ExitReason, SandboxLimits, SandboxPaths
from ashd.sandboxing._disk import disk_quota_problems, is_mounted, loop_devices_of
from tests.fixtures.sandboxes import ROUTES, TEST_LIMITS, program_spec, require_isolation, started_launcher, wait_for

pytestmark = pytest.mark.sandbox
MIB = 1024 * 1024
DISK = 48 * MIB


def require_disk_quota() -> None:
    require_isolation()
    problems = disk_quota_problems()
    if problems:
        message = f"this host cannot make sandbox disks: {'; '.join(problems)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A filesystem of the test's own, so its free space moves only with what the test does."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("route", ROUTES)
def test_writes_past_the_disk_fail_with_no_space_and_the_host_pays_at_most_the_quota(
        tmp_path: Path, route: str) -> None:
    require_disk_quota()
    limits = SandboxLimits(memory_bytes=256 * MIB, pids=64, disk_bytes=DISK)
    with small_tmpfs(tmp_path / "fs", 256) as fs, started_launcher(fs / "data", route) as launcher:
        free_before = _free(fs)
        paths = launcher.prepare("filler", DISK)
        assert is_mounted(paths.disk) and paths.image.stat().st_size == DISK
        proc = launcher.launch(program_spec(paths, "filler", "disk_probe.py", "200", limits=limits))
        info = proc.wait(120)
        proc.cleanup()
        log = (paths.logs / "sandbox.log").read_text()
        lowest_free = _free(fs)  # the probe left the sandbox's disk full
        assert info.reason is ExitReason.NORMAL, log
        verdict = json.loads(log.strip().splitlines()[-1])
        launcher.destroy_dirs("filler")
        assert loop_devices_of(paths.image) == []
        assert not paths.root.exists()
    assert verdict["same_fs"], verdict  # /workspace, /tmp and HOME are all on the sandbox's disk
    assert DISK - 8 * MIB < verdict["disk_total"] <= DISK
    for place in ("workspace", "tmp", "home"):
        result = verdict[place]
        assert "No space left on device" in result["error"], (place, result)
        assert result["size"] <= DISK, (place, result)
    assert free_before - lowest_free <= DISK + MIB  # the image (plus the small log and etc files)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_the_disk_image_is_not_visible_inside_and_outlives_a_lost_mount(tmp_path: Path) -> None:
    """What the start-up rescue relies on: after a reboot (or a server in a private mount
    namespace) the image is no longer mounted; mounting it again brings the workspace back."""
    require_disk_quota()
    with started_launcher(tmp_path, "zygote") as launcher:
        paths = launcher.prepare("leftover", DISK)
        (paths.workspace / "notes.txt").write_text("kept across the lost mount")
        busy = (paths.workspace / "notes.txt").open()  # a sandbox still exiting holds the filesystem
        subprocess.run(["umount", "-l", str(paths.disk)], check=True)  # what a reboot does
        assert not (paths.workspace / "notes.txt").exists()
        # A lazy unmount lets the filesystem go, and its loop device with it, once nothing uses it;
        # until then a second instance on the image would not see the first one's unwritten changes.
        with busy:
            assert loop_devices_of(paths.image)
            with pytest.raises(SandboxError, match="still attached to /dev/loop"):
                launcher.mount_leftover("leftover", wait_seconds=0.3)
            assert not is_mounted(paths.disk)
            threading.Timer(0.5, busy.close).start()  # lets go while the rescue waits
            workspace = launcher.mount_leftover("leftover", wait_seconds=60)
        assert workspace == paths.workspace
        assert (workspace / "notes.txt").read_text() == "kept across the lost mount"
        launcher.destroy_dirs("leftover")
        assert loop_devices_of(paths.image) == [] and not paths.root.exists()
        assert launcher.mount_leftover("never-made") is None


def test_stop_unmounts_what_is_left_and_keeps_the_image(tmp_path: Path) -> None:
    require_disk_quota()
    with started_launcher(tmp_path, "bwrap") as launcher:
        paths = launcher.prepare("left", DISK)
        (paths.workspace / "a.txt").write_text("a")
    assert not is_mounted(paths.disk)
    assert loop_devices_of(paths.image) == []
    assert paths.image.exists()  # the next start's rescue mounts it again


def test_preallocated_disks_reserve_their_space_and_refuse_what_does_not_fit(tmp_path: Path) -> None:
    require_disk_quota()
    with small_tmpfs(tmp_path / "fs", 96) as fs, \
            started_launcher(fs / "data", "zygote", preallocate_disk=True) as launcher:
        paths = launcher.prepare("reserved", DISK)
        assert paths.image.stat().st_blocks * 512 >= DISK  # all of it, up front
        with pytest.raises(CapacityError, match="not enough free space"):
            launcher.prepare("too-big", 64 * MIB)
        assert not SandboxPaths(launcher.sandboxes_dir / "too-big").image.exists()
        launcher.destroy_dirs("too-big")
        launcher.destroy_dirs("reserved")


def test_without_a_quota_the_layout_is_the_same_plain_directories(tmp_path: Path) -> None:
    require_isolation()
    limits = SandboxLimits(memory_bytes=TEST_LIMITS.memory_bytes, pids=TEST_LIMITS.pids, disk_bytes=0)
    from ashd.sandboxing import LauncherConfig, SandboxLauncher

    launcher = SandboxLauncher(LauncherConfig(tmp_path, limits, use_zygote=False))
    launcher.start()
    try:
        assert not launcher.disk_quota and not launcher.isolation.disk_quota
        assert "no disk quota (off)" in launcher.isolation.detail
        paths = launcher.prepare("plain")
        assert not is_mounted(paths.disk) and not paths.image.exists()
        assert all(d.is_dir() for d in (paths.workspace, paths.home, paths.tmp, paths.run, paths.logs))
    finally:
        launcher.stop()


def test_default_size_disks_are_copies_of_one_template(tmp_path: Path) -> None:
    require_disk_quota()
    templates = tmp_path / "sandboxes" / ".disk-templates"
    templates.mkdir(parents=True)
    (templates / "ext4-v0-1024.img").write_text("made by an older server")
    with started_launcher(tmp_path, "zygote") as launcher:
        one, two = launcher.prepare("one"), launcher.prepare("two")
        other = launcher.prepare("other", DISK)
        assert [p.name for p in templates.iterdir()] == [f"ext4-v1-{TEST_LIMITS.disk_bytes}.img"]
        (one.workspace / "mine.txt").write_text("one's")
        assert not (two.workspace / "mine.txt").exists()  # copies, not one shared filesystem
        for paths, size in ((one, TEST_LIMITS.disk_bytes), (two, TEST_LIMITS.disk_bytes), (other, DISK)):
            assert is_mounted(paths.disk) and paths.image.stat().st_size == size
            assert paths.image.stat().st_blocks * 512 < 8 * MIB  # sparse: only the metadata is written
        for name in ("one", "two", "other"):
            launcher.destroy_dirs(name)


def test_a_workspace_left_by_an_older_version_is_still_rescued(tmp_path: Path) -> None:
    """Before sandbox disks the workspace was `<id>/workspace` on the data disk: a crash just
    before the upgrade must not lose it."""
    require_disk_quota()
    with started_launcher(tmp_path, "zygote") as launcher:
        old = launcher.sandboxes_dir / "sb-0123456789abcdef" / "workspace"
        old.mkdir(parents=True)
        (old / "notes.txt").write_text("from the old layout")
        assert launcher.mount_leftover("sb-0123456789abcdef") == old
        launcher.destroy_dirs("sb-0123456789abcdef")
        assert not old.parent.exists()


def _mount_points(pid: int) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return [line.split()[4] for line in f]


def test_disks_stay_out_of_the_fork_servers_namespace_and_each_sandbox_mounts_only_its_own(tmp_path: Path) -> None:
    """The fork server keeps a mount namespace of its own without the sandboxes' disks, so that a
    sandbox's start does not copy (and make private, and detach) one mount per session held; each
    sandbox mounts its own disk by device: the host sees what it writes, no other sandbox's disk is
    in its namespace, and nothing in the fork server's keeps a disk's loop device busy."""
    require_disk_quota()
    with started_launcher(tmp_path, "zygote") as launcher:
        sandboxes = tmp_path / "sandboxes"
        held = [launcher.prepare(f"held-{i}", DISK) for i in range(3)]
        zygote = launcher.zygote_pid
        assert zygote is not None
        assert not [p for p in _mount_points(zygote) if p.startswith(f"{sandboxes}/")]

        def run(sandbox_id: str, paths: SandboxPaths) -> dict[str, Any]:
            proc = launcher.launch(program_spec(paths, sandbox_id, "mount_probe.py", f"written by {sandbox_id}"))
            info = proc.wait(60)
            proc.cleanup()
            log = (paths.logs / "sandbox.log").read_text()
            assert info.reason is ExitReason.NORMAL, log
            return dict(json.loads(log.strip().splitlines()[-1]))

        seen = run("held-0", held[0])
        assert (held[0].workspace / "from-inside.txt").read_text() == "written by held-0"
        assert seen["workspace_dev"] == os.stat(held[0].workspace).st_dev  # the same filesystem
        assert not [p for p in seen["mounts"] if str(tmp_path) in p], seen

        # A fork server started while disks are mounted (a restart) leaves them out too.
        os.kill(zygote, 9)

        def gone() -> bool:
            return launcher.zygote_pid != zygote

        wait_for(gone, what="the fork server's end")
        later = launcher.prepare("later", DISK)
        assert run("later", later)["workspace_dev"] == os.stat(later.workspace).st_dev
        restarted = launcher.zygote_pid
        assert restarted is not None and restarted != zygote
        assert not [p for p in _mount_points(restarted) if p.startswith(f"{sandboxes}/")]

        for sandbox_id in ("held-0", "held-1", "held-2", "later"):
            image = launcher.paths_for(sandbox_id).image
            launcher.destroy_dirs(sandbox_id)

            def freed(image: Path = image) -> bool:
                return loop_devices_of(image) == []

            wait_for(freed, what=f"{sandbox_id}'s loop device freed")


def test_a_data_dir_reached_through_a_symlink_works_the_same(tmp_path: Path) -> None:
    """The sandbox opens its log through the server's root (`/proc/<server>/root/...`): a symlink on
    the way, followed from the opener's root in the fork server's namespace, would miss the disk."""
    require_disk_quota()
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real)
    with started_launcher(tmp_path / "linked", "zygote") as launcher:
        paths = launcher.prepare("linked", DISK)
        proc = launcher.launch(program_spec(paths, "linked", "mount_probe.py", "through a link"))
        info = proc.wait(60)
        proc.cleanup()
        log = (paths.logs / "sandbox.log").read_text()
        assert info.reason is ExitReason.NORMAL, log
        assert json.loads(log.strip().splitlines()[-1])["workspace_dev"] == os.stat(paths.workspace).st_dev
        assert (real / "sandboxes" / "linked" / "disk" / "workspace" / "from-inside.txt").read_text() == "through a link"
        zygote = launcher.zygote_pid
        assert zygote is not None
        assert not [p for p in _mount_points(zygote) if p.startswith(f"{real}/sandboxes/")]
        launcher.destroy_dirs("linked")
