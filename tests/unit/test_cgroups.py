"""cgroup v2 and v1 file-writing logic against fake cgroup trees in a temporary directory.

This host is v1, so v2 is only exercised here; the real v1 path is covered by the sandbox tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ashd.sandboxing._cgroups import (
    V2_SERVICE_LEAF,
    CgroupTree,
    data_dir_key,
    detect_version,
    parse_proc_cgroup,
)
from ashd.sandboxing._types import SandboxLimits

LIMITS = SandboxLimits(memory_bytes=64 * 1024 * 1024, pids=32, cpu_cores=0.5)
V1_SELF = "12:pids:/\n4:memory:/svc/abc\n3:cpu,cpuacct:/\n0::/\n"


def fake_v2(root: Path, own: str = "system.slice/ashd.service", procs: str = "111\n222\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    own_dir = root / own
    own_dir.mkdir(parents=True, exist_ok=True)
    (own_dir / "cgroup.procs").write_text(procs)
    return own_dir


def fake_v1(root: Path) -> None:
    for controller, own in (("memory", "svc/abc"), ("pids", ""), ("cpu", "")):
        d = root / controller / own
        d.mkdir(parents=True, exist_ok=True)
        (root / controller / "cgroup.procs").write_text("")
    (root / "memory" / "svc" / "abc" / "cgroup.procs").write_text("1\n")


def test_parse_proc_cgroup_maps_controllers_and_the_unified_line() -> None:
    paths = parse_proc_cgroup(V1_SELF)
    assert paths == {"pids": "/", "memory": "/svc/abc", "cpu": "/", "cpuacct": "/", "": "/"}


def test_detect_version(tmp_path: Path) -> None:
    assert detect_version(tmp_path / "none") == "none"
    fake_v2(tmp_path / "v2")
    assert detect_version(tmp_path / "v2") == "v2"
    fake_v1(tmp_path / "v1")
    assert detect_version(tmp_path / "v1") == "v1"
    (tmp_path / "v2only-hugetlb").mkdir()
    (tmp_path / "v2only-hugetlb" / "cgroup.controllers").write_text("hugetlb\n")
    assert detect_version(tmp_path / "v2only-hugetlb") == "none"


def test_v2_setup_moves_the_service_into_a_leaf_and_delegates_controllers(tmp_path: Path) -> None:
    own = fake_v2(tmp_path / "cg")
    tree = CgroupTree(
        tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup="0::/system.slice/ashd.service\n"
    )
    tree.setup()
    leaf = own / V2_SERVICE_LEAF
    # Each pid is written in turn (the kernel keeps only the move; the fake file keeps the last).
    assert (leaf / "cgroup.procs").read_text() == "222"
    for d in (own, own / "ashd", own / "ashd" / tree.key):
        assert (d / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert tree.parent_dirs() == {"unified": own / "ashd" / tree.key}


def test_v2_after_a_restart_inside_our_leaf_uses_the_same_parent(tmp_path: Path) -> None:
    own = fake_v2(tmp_path / "cg")
    restarted = CgroupTree(
        tmp_path / "data",
        mount_root=tmp_path / "cg",
        proc_self_cgroup=f"0::/system.slice/ashd.service/{V2_SERVICE_LEAF}\n",
    )
    assert restarted.parent_dirs() == {"unified": own / "ashd" / data_dir_key(tmp_path / "data")}


def test_v2_root_cgroup_needs_no_leaf(tmp_path: Path) -> None:
    fake_v2(tmp_path / "cg", own="")
    tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup="0::/\n")
    tree.setup()
    assert not (tmp_path / "cg" / V2_SERVICE_LEAF).exists()
    assert (tmp_path / "cg" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_v2_sandbox_limits_oom_usage_and_listing(tmp_path: Path) -> None:
    fake_v2(tmp_path / "cg")
    tree = CgroupTree(
        tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup="0::/system.slice/ashd.service\n"
    )
    tree.setup()
    cg = tree.create("sbx1", LIMITS)
    d = cg.dirs["unified"]
    assert (d / "memory.max").read_text() == str(64 * 1024 * 1024)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "32"
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert cg.join_files == [d / "cgroup.procs"]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n")
    (d / "memory.current").write_text("123456\n")
    (d / "cgroup.procs").write_text("7\n8\n")
    assert cg.oom_kills() == 1
    assert cg.memory_bytes() == 123456
    assert cg.pids() == [7, 8]
    assert [c.dirs for c in tree.existing()] == [cg.dirs]


def test_v1_sandbox_limits_and_oom_counter(tmp_path: Path) -> None:
    fake_v1(tmp_path / "cg")
    tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    tree.setup()
    parents = tree.parent_dirs()
    assert parents["memory"] == tmp_path / "cg" / "memory" / "svc" / "abc" / "ashd" / tree.key
    assert parents["pids"] == tmp_path / "cg" / "pids" / "ashd" / tree.key
    memory = parents["memory"] / "sbx"
    memory.mkdir()
    (memory / "memory.memsw.limit_in_bytes").write_text("")  # swap accounting present
    cg = tree.create("sbx", LIMITS)
    assert (memory / "memory.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (cg.dirs["pids"] / "pids.max").read_text() == "32"
    assert (cg.dirs["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert (cg.dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "50000"
    assert cg.join_files == [d / "tasks" for d in cg.dirs.values()]
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cg.oom_kills() == 2


def test_keys_separate_data_dirs(tmp_path: Path) -> None:
    assert data_dir_key(tmp_path / "a") != data_dir_key(tmp_path / "b")
    assert data_dir_key(tmp_path / "a") == data_dir_key(tmp_path / "x" / ".." / "a")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_remove_and_teardown_leave_nothing(tmp_path: Path, version: str) -> None:
    root = tmp_path / "cg"
    if version == "v2":
        fake_v2(root, own="", procs="")
        self_cgroup = "0::/\n"
    else:
        fake_v1(root)
        self_cgroup = V1_SELF
    tree = CgroupTree(tmp_path / "data", mount_root=root, proc_self_cgroup=self_cgroup)
    tree.setup()
    cg = tree.create("gone", LIMITS)
    for d in cg.dirs.values():  # a real cgroupfs removes its files with the dir
        for f in d.iterdir():
            f.unlink()
    assert cg.remove()
    for parent in tree.parent_dirs().values():
        for d in (parent, parent.parent):
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
    tree.teardown()
    assert not any(p.exists() for p in tree.parent_dirs().values())
    assert not any((p.parent).exists() for p in tree.parent_dirs().values())


def test_sweep_removes_only_empty_parents_and_create_recovers(tmp_path: Path) -> None:
    fake_v1(tmp_path / "cg")
    tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    tree.setup()
    pids_ashd = tree.parent_dirs()["pids"].parent
    (pids_ashd / "deadbeef0000").mkdir()  # a killed server's empty parent
    (pids_ashd / "livelive0000" / "sbx").mkdir(parents=True)  # a live service with a sandbox
    other = CgroupTree(tmp_path / "other", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    assert other.sweep_empty_parents() >= 1
    assert not (pids_ashd / "deadbeef0000").exists()
    assert (pids_ashd / "livelive0000" / "sbx").exists()
    assert not tree.parent_dirs()["pids"].exists()  # ours was empty too, and got swept
    cg = tree.create("sbx", LIMITS)
    assert all(d.is_dir() for d in cg.dirs.values())


def test_cpu_time_is_read_from_the_accounting_of_each_version(tmp_path: Path) -> None:
    fake_v2(tmp_path / "v2")
    tree = CgroupTree(tmp_path / "d2", mount_root=tmp_path / "v2", proc_self_cgroup="0::/system.slice/ashd.service\n")
    tree.setup()
    cg = tree.create("sbx", LIMITS)
    assert cg.cpu_seconds() is None  # no accounting file: not zero, unknown
    (cg.dirs["unified"] / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert cg.cpu_seconds() == 2.5

    fake_v1(tmp_path / "v1")
    (tmp_path / "v1" / "cpuacct").mkdir()
    (tmp_path / "v1" / "cpuacct" / "cgroup.procs").write_text("")
    tree1 = CgroupTree(tmp_path / "d1", mount_root=tmp_path / "v1", proc_self_cgroup=V1_SELF)
    tree1.setup()
    cg1 = tree1.create("sbx", LIMITS)
    assert set(cg1.dirs) == {"memory", "pids", "cpu", "cpuacct"}  # the process joins cpuacct too
    assert len(cg1.join_files) == 4
    (cg1.dirs["cpuacct"] / "cpuacct.usage").write_text("1500000000\n")
    assert cg1.cpu_seconds() == 1.5


def test_kill_and_remove_waits_for_every_task_to_be_reaped(tmp_path: Path) -> None:
    fake_v1(tmp_path / "cg")
    tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    tree.setup()
    cg = tree.create("draining", LIMITS)
    for d in cg.dirs.values():  # a real cgroupfs removes its files with the dir
        for f in d.iterdir():
            f.unlink()
    # cgroup.procs is empty, but one task is still charged (exiting, or a zombie nobody reaped).
    (cg.dirs["pids"] / "pids.current").write_text("1\n")
    assert cg.charged() == 1
    reaps: list[int] = []

    def reap() -> None:
        reaps.append(1)
        if len(reaps) == 3:
            (cg.dirs["pids"] / "pids.current").unlink()  # reaped: the kernel's count drops to 0

    assert cg.kill_and_remove(10.0, reap=reap)
    assert len(reaps) == 3  # not removed while the task was still charged
    assert not any(d.exists() for d in cg.dirs.values())


def test_kill_and_remove_gives_up_on_a_task_never_reaped(tmp_path: Path) -> None:
    fake_v1(tmp_path / "cg")
    tree = CgroupTree(tmp_path / "data", mount_root=tmp_path / "cg", proc_self_cgroup=V1_SELF)
    tree.setup()
    cg = tree.create("stuck", LIMITS)
    (cg.dirs["pids"] / "pids.current").write_text("1\n")
    assert not cg.kill_and_remove(0.0)
