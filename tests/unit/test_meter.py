"""ResourceMeter against fake cgroup trees (v2 and v1) and the disk-full rule.

The real counters are exercised end to end in tests/e2e/test_resource_limits.py (v1 on this host);
v2's file names and formats are checked here, as tests/unit/test_cgroups.py does for the limits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ashd.sandboxing._cgroups import CgroupTree
from ashd.sandboxing._disk import MIB, DiskUsage
from ashd.sandboxing._meter import ResourceMeter
from ashd.sandboxing._types import SandboxLimits
from tests.unit.test_cgroups import V1_SELF, fake_v1, fake_v2

LIMITS = SandboxLimits(memory_bytes=64 * MIB, pids=32, cpu_cores=0.5, disk_bytes=256 * MIB)


def _v2_events(d: Path, oom_kill: int, pids_max: int) -> None:
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 9\noom 3\noom_kill {oom_kill}\noom_group_kill 0\n")
    (d / "pids.events").write_text(f"max {pids_max}\n")


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_counters_are_reported_once_each_with_the_limit_named(tmp_path: Path, version: str) -> None:
    if version == "v2":
        fake_v2(tmp_path / "cg")
        tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg",
                          proc_self_cgroup="0::/system.slice/ashd.service\n")
    else:
        fake_v1(tmp_path / "cg")
        tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    tree.setup()
    cg = tree.create("sbx", LIMITS)

    def counters(oom_kill: int, pids_max: int) -> None:
        if version == "v2":
            _v2_events(cg.dirs["unified"], oom_kill, pids_max)
        else:
            (cg.dirs["memory"] / "memory.oom_control").write_text(
                f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
            (cg.dirs["pids"] / "pids.events").write_text(f"max {pids_max}\n")

    counters(1, 0)  # before the sandbox was ours to watch: not reported
    meter = ResourceMeter(cg, None, LIMITS)
    assert meter.check() == []
    counters(3, 5)
    notices = meter.check()
    assert [n.limit for n in notices] == ["memory", "pids"]
    assert all(n.new for n in notices)
    assert "memory limit of 64 MiB" in notices[0].message and "killed 2 processes" in notices[0].message
    assert "at most 32 processes" in notices[1].message and "failed 5 times" in notices[1].message
    assert meter.check() == []  # told once
    counters(4, 5)
    assert [n.limit for n in meter.check()] == ["memory"]


def test_a_full_disk_is_new_once_and_repeated_while_it_stays_full(tmp_path: Path) -> None:
    meter = ResourceMeter(None, tmp_path, LIMITS)
    usages = iter([DiskUsage(250 * MIB, 200 * MIB, 1000), DiskUsage(250 * MIB, MIB, 1000),
                   DiskUsage(250 * MIB, MIB // 2, 1000), DiskUsage(250 * MIB, 100 * MIB, 1000),
                   DiskUsage(250 * MIB, 100 * MIB, 0)])
    meter.disk_usage = lambda: next(usages)  # type: ignore[method-assign]
    assert meter.check() == []
    first = meter.check()
    assert [(n.limit, n.new) for n in first] == [("disk", True)]
    assert "disk of 256 MiB" in first[0].message and "249 MiB used" in first[0].message
    assert [(n.limit, n.new) for n in meter.check()] == [("disk", False)]  # still full: for the model only
    assert meter.check() == []  # files removed
    no_inodes = meter.check()
    assert [(n.limit, n.new) for n in no_inodes] == [("disk", True)] and "too many files" in no_inodes[0].message


def test_full_means_a_small_margin_left_or_no_inode() -> None:
    assert DiskUsage(64 * MIB, MIB, 10).full  # ext4 refuses writes before its very last block
    assert not DiskUsage(64 * MIB, 8 * MIB, 10).full
    assert DiskUsage(4096 * MIB, 5 * MIB, 10).full  # 0.2% of a large disk
    assert not DiskUsage(4096 * MIB, 30 * MIB, 10).full
    assert DiskUsage(64 * MIB, 30 * MIB, 0).full
    assert DiskUsage(64 * MIB, 30 * MIB, 10).used_bytes == 34 * MIB


def test_no_cgroup_and_no_disk_report_nothing() -> None:
    assert ResourceMeter(None, None, LIMITS).check() == []
