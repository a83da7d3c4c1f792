"""What the launcher hands a sandbox, seen from inside real sandboxes (tests/fixtures/launcher_probe.py).

On both launch routes (bwrap and zygote): the environment (no server secret), cwd, the sandbox's
own directories (owner, mode, writable, mount options, disk size), its network (none unless asked
for), the descriptors it inherits. On the host: the permissions of the sandbox tree, the launch
route, a launch that fails leaving nothing behind, stop leaving no process or mount. Weak
isolation's plain children: clean env, HOME, own session, parent-death signal, cgroup. Quick on
purpose: first in the launcher's mutation test list (pyproject.toml) so mutants die fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import psutil
import pytest

import ashd
from ashd.errors import SandboxError
from ashd.sandboxing import BridgeConnection, ExitReason, LauncherConfig, SandboxLauncher, SandboxSpec
from ashd.sandboxing._cgroups import CgroupTree
from ashd.sandboxing._disk import MIB, is_mounted, loop_devices_of
from ashd.sandboxing._egress_policy import EgressPolicy
from ashd.sandboxing._zygote_client import ZygoteChild
from tests.fixtures.sandboxes import ROUTES, TEST_LIMITS, program_spec, require_isolation, started_launcher, wait_for

pytestmark = pytest.mark.sandbox

SECRET = "ashd-launcher-secret-51c2"
DIRS = ("/workspace", "/home/agent", "/run/ashd", "/tmp")
SMALL_DISK = 48 * MIB
DNS = IPv4Address("192.0.2.53")


def _run_probe(launcher: SandboxLauncher, sandbox_id: str, spec: SandboxSpec) -> dict[str, Any]:
    proc = launcher.launch(spec)
    info = proc.wait(60)
    log = (spec.paths.logs / "sandbox.log").read_text()
    proc.cleanup()
    assert info.reason is ExitReason.NORMAL, log
    seen: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return seen


def _zygote_pids(data_dir: Path) -> list[int]:
    """The fork servers this process started for the launcher on `data_dir` (their output goes to
    its zygote.log): a module-scoped launcher of another test file, on the same pytest worker, has
    its own."""
    def logs_under(pid: int) -> bool:
        with contextlib.suppress(OSError):
            return Path(os.readlink(f"/proc/{pid}/fd/2")).is_relative_to(data_dir.resolve())
        return False

    return [p.pid for p in psutil.Process().children()
            if "ashd.zygote._fork_server" in " ".join(p.cmdline()) and logs_under(p.pid)]


@pytest.fixture(scope="module", params=ROUTES)
def seen(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One launcher per route; a probe without network (on a small disk), one with, and the bridge."""
    require_isolation()
    route = request.param
    os.environ["ASHD_TEST_SECRET"] = SECRET  # in the server's environment, before the launcher starts
    data_dir = tmp_path_factory.mktemp(f"launcher-{route}") / "data"  # not made yet: start makes it
    # A descriptor of the server's that child processes could inherit (as a socket-activated one is).
    held = os.open(data_dir.parent / "server-only.txt", os.O_CREAT | os.O_RDWR)
    os.set_inheritable(held, True)
    out: dict[str, Any] = {"route": route, "data_dir": data_dir}
    try:
        with started_launcher(data_dir, route, egress=EgressPolicy(dns=(DNS,))) as launcher:
            out["launcher"] = launcher
            paths = launcher.prepare("probe", SMALL_DISK)
            assert launcher.prepare("probe", SMALL_DISK) == paths  # again: idempotent
            spec = program_spec(paths, "probe", "launcher_probe.py", *DIRS, env={"GIVEN": "yes"})
            out["probe"] = _run_probe(launcher, "probe", spec)
            out["paths"] = paths
            out["image_blocks"] = paths.image.stat().st_blocks * 512
            out["modes"] = {name: os.stat(p).st_mode & 0o7777 for name, p in {
                "sandboxes": launcher.sandboxes_dir, "root": paths.root, "disk": paths.disk,
                "logs": paths.logs}.items()}
            if route == "zygote":
                out["modes"]["newroot"] = os.stat(launcher.sandboxes_dir / ".newroot").st_mode & 0o7777

            net_paths = launcher.prepare("net")
            net_spec = program_spec(net_paths, "net", "launcher_probe.py", network=True)
            proc = launcher.launch(net_spec)
            out["net_link_running"] = launcher.network_link("net") is not None
            out["net_process_running"] = launcher.process("net") is proc
            info = proc.wait(60)
            log = (net_paths.logs / "sandbox.log").read_text()
            assert info.reason is ExitReason.NORMAL, log
            proc.cleanup()
            out["net"] = json.loads(log.strip().splitlines()[-1])
            out["net_link_after"] = launcher.network_link("net")
            out["net_process_after"] = launcher.process("net")

            # The launch route: a sandbox that waits to be killed, its monitor's parent looked at.
            waiting_paths = launcher.prepare("waiting")
            waiting = launcher.launch(SandboxSpec("waiting", waiting_paths,
                                                  argv=(sys.executable, "-c", "import time; time.sleep(120)")))
            out["monitor_is_our_child"] = psutil.Process(waiting.pid).ppid() == os.getpid()
            waiting.kill()
            waiting.wait(30)
            waiting.cleanup()

            # argv None: the bridge itself (bwrap: the default argv; zygote: its payload).
            bridge_paths = launcher.prepare("bridge")
            bridge = launcher.launch(SandboxSpec("bridge", bridge_paths))
            out["bridge_listening"] = _bridge_answers(bridge_paths.bridge_socket)  # its socket is the launcher's
            out["bridge_log"] = (bridge_paths.logs / "sandbox.log").read_text()
            bridge.kill()
            bridge.wait(30)
            bridge.cleanup()
            out["disks"] = [paths.disk, net_paths.disk, bridge_paths.disk, waiting_paths.disk]
        out["mounted_after_stop"] = [str(d) for d in out["disks"] if is_mounted(d)]
        out["zygotes_after_stop"] = _zygote_pids(data_dir)
        yield out
    finally:
        os.close(held)
        os.environ.pop("ASHD_TEST_SECRET", None)


def test_env_is_the_basics_and_the_callers_only(seen: dict[str, Any]) -> None:
    env = seen["probe"]["env"]
    assert SECRET not in json.dumps(env)
    assert env["GIVEN"] == "yes"
    assert (env["HOME"], env["TMPDIR"], env["USER"]) == ("/home/agent", "/tmp", "agent")
    assert seen["probe"]["cwd"] == "/workspace"


def test_own_directories_are_private_to_the_sandbox_uid_and_tmp_is_sticky(seen: dict[str, Any]) -> None:
    probe = seen["probe"]
    assert probe["uid"] != 0
    for d in ("/workspace", "/home/agent", "/run/ashd"):
        assert probe["dirs"][d]["uid"] == probe["uid"], d
        assert probe["dirs"][d]["mode"] == 0o700, d
        assert probe["dirs"][d]["writable"], d
    assert probe["dirs"]["/tmp"]["mode"] == 0o1777
    assert probe["dirs"]["/tmp"]["writable"]


def test_the_disk_is_the_size_asked_for_sparse_and_hands_freed_blocks_back(seen: dict[str, Any]) -> None:
    workspace = seen["probe"]["dirs"]["/workspace"]
    assert SMALL_DISK // 2 < workspace["size"] <= SMALL_DISK
    assert "discard" in workspace["options"].split(",")
    assert "nosuid" in workspace["options"].split(",")
    assert seen["image_blocks"] < SMALL_DISK // 2  # sparse unless preallocate_disk is set


def test_the_sandbox_tree_is_traverse_only_on_the_host(seen: dict[str, Any]) -> None:
    modes = seen["modes"]
    assert (modes["sandboxes"], modes["root"], modes["disk"]) == (0o711, 0o711, 0o711)
    assert modes["logs"] & 0o077 == 0
    if seen["route"] == "zygote":
        assert modes["newroot"] == 0o700


def test_no_descriptor_of_the_server_reaches_the_sandbox(seen: dict[str, Any]) -> None:
    assert not [fd for fd in seen["probe"]["fds"] if "server-only" in fd]


def test_network_only_when_asked_for(seen: dict[str, Any]) -> None:
    assert seen["probe"]["interfaces"] == ["lo"]
    assert len(seen["net"]["interfaces"]) > 1
    assert f"nameserver {DNS}" in seen["net"]["resolv_conf"]
    assert seen["net_link_running"] and seen["net_process_running"]
    # Released with the sandbox's cleanup.
    assert seen["net_link_after"] is None and seen["net_process_after"] is None


def test_the_bridge_runs_when_no_argv_is_given_on_the_configured_route(seen: dict[str, Any]) -> None:
    # Under scripts/mutation this process imports ashd from a copy on PYTHONPATH, which the bwrap
    # route's `python -I -m ashd.bridge` ignores: there, that it was the bridge that ran is what shows.
    assert seen["bridge_listening"] or "'ashd.bridge'" in seen["bridge_log"], seen["bridge_log"]
    # bwrap: the monitor is the server's own child; zygote: the fork server's.
    assert seen["monitor_is_our_child"] is (seen["route"] == "bwrap")


def test_stop_leaves_no_mount_and_no_fork_server(seen: dict[str, Any]) -> None:
    assert seen["mounted_after_stop"] == []
    assert seen["zygotes_after_stop"] == []


def test_ids_that_could_name_another_path_are_refused(tmp_path: Path) -> None:
    launcher = SandboxLauncher(LauncherConfig(tmp_path, TEST_LIMITS))
    for bad in ("../escape", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(SandboxError, match="invalid sandbox id"):
            launcher.paths_for(bad)
    assert launcher.paths_for("sb-1.a_b").root == tmp_path / "sandboxes" / "sb-1.a_b"


@pytest.mark.parametrize("route", ROUTES)
def test_a_failed_launch_leaves_no_cgroup_network_or_entry(tmp_path: Path, route: str) -> None:
    require_isolation()
    with started_launcher(tmp_path, route) as launcher:
        paths = launcher.prepare("failing")
        bad = SandboxSpec("failing", paths, network=True, argv=(sys.executable, "-c", "pass"), seccomp="no-such")
        with pytest.raises(ValueError, match="unknown seccomp profile"):
            launcher.launch(bad)
        assert launcher.process("failing") is None
        assert launcher.network_link("failing") is None
        assert not any((d / "failing").exists() for d in CgroupTree(tmp_path).parent_dirs().values())
        # The same id launches fine afterwards.
        proc = launcher.launch(SandboxSpec("failing", paths, network=True, argv=(sys.executable, "-c", "pass")))
        assert proc.wait(60).reason is ExitReason.NORMAL
        proc.cleanup()


def test_default_route_restart_and_a_dead_fork_server(tmp_path: Path) -> None:
    """The default config launches through the zygote; a zygote that died is started again; a
    stopped launcher refuses launches and can be started again on the same data dir."""
    require_isolation()
    launcher = SandboxLauncher(LauncherConfig(tmp_path, TEST_LIMITS))
    paths = launcher.prepare("again")
    spec = SandboxSpec("again", paths, argv=(sys.executable, "-c", "pass"))
    with pytest.raises(SandboxError, match="not started"):
        launcher.launch(spec)
    assert not launcher.isolation.weak  # probed on first use, before start
    for _ in range(2):
        launcher.start()
        try:
            for zygote in _zygote_pids(tmp_path):
                os.kill(zygote, signal.SIGKILL)
                psutil.Process(zygote).wait(30)
            proc = launcher.launch(spec)
            assert proc.wait(60).reason is ExitReason.NORMAL
            proc.cleanup()
            assert len(_zygote_pids(tmp_path)) == 1  # the default route is the zygote: it was started again
        finally:
            launcher.stop()
        with pytest.raises(SandboxError, match="not started"):
            launcher.launch(spec)


def test_a_restarted_fork_server_is_not_answered_by_the_dead_ones_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead zygote's reader thread that wakes late (held here in its report of a sandbox that died
    with it, as a loaded host delays it) reports that exit to its own zygote's waiters only: never
    to the next zygote's spawns, which it once answered with "the sandbox fork server exited"."""
    require_isolation()
    release = threading.Event()
    set_status = ZygoteChild.set_status

    def late(child: ZygoteChild, status: int) -> None:
        if status == -9:  # an orphan of the dead zygote
            release.wait(60)
        set_status(child, status)

    monkeypatch.setattr(ZygoteChild, "set_status", late)
    with started_launcher(tmp_path, "zygote") as launcher:
        client = launcher._zygote
        assert client is not None
        held_paths = launcher.prepare("held")
        held = launcher.launch(SandboxSpec("held", held_paths, argv=(sys.executable, "-c", "import time; time.sleep(600)")))
        dead_reader = client._reader
        assert dead_reader is not None
        for zygote in _zygote_pids(tmp_path):
            os.kill(zygote, signal.SIGKILL)
            psutil.Process(zygote).wait(30)
        launcher._spawner.submit(client.start).result()  # the next zygote, ready
        release.set()
        dead_reader.join(60)  # the dead zygote's reader has reported its exit
        paths = launcher.prepare("late")
        proc = launcher.launch(SandboxSpec("late", paths, argv=(sys.executable, "-c", "pass")))
        assert proc.wait(60).reason is ExitReason.NORMAL
        proc.cleanup()
        held.cleanup()
        assert len(_zygote_pids(tmp_path)) == 1


def test_a_sandbox_asking_no_disk_on_a_quota_launcher_gets_plain_directories(tmp_path: Path) -> None:
    # A launcher without a quota: test_sandbox_disk.py, test_without_a_quota_the_layout_is_...
    require_isolation()
    with started_launcher(tmp_path / "quota", "bwrap") as quota:
        assert quota.disk_quota
        zero = quota.prepare("zero", 0)
        assert not zero.image.exists() and not is_mounted(zero.disk)


# -- weak isolation: plain children ------------------------------------------------------------


@pytest.fixture
def weak(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxLauncher]:
    monkeypatch.setenv("ASHD_TEST_SECRET", SECRET)
    config = LauncherConfig(short_tmp, TEST_LIMITS, bwrap="/nonexistent/bwrap", allow_weak_isolation=True)
    launcher = SandboxLauncher(config)
    launcher.start()
    try:
        assert launcher.isolation.weak
        yield launcher
    finally:
        launcher.stop()


def _weak_probe(launcher: SandboxLauncher, sandbox_id: str, env: dict[str, str]) -> dict[str, Any]:
    paths = launcher.prepare(sandbox_id)
    argv = (sys.executable, "-I", str(Path(__file__).parents[1] / "fixtures" / "launcher_probe.py"))
    return _run_probe(launcher, sandbox_id, SandboxSpec(sandbox_id, paths, env=env, argv=argv))


def test_weak_children_get_their_own_home_session_and_cgroup(weak: SandboxLauncher, tmp_path: Path) -> None:
    held = os.open(tmp_path / "server-only.txt", os.O_CREAT | os.O_RDWR)
    os.set_inheritable(held, True)
    try:
        probe = _weak_probe(weak, "weak", {"GIVEN": "1"})
    finally:
        os.close(held)
    paths = weak.paths_for("weak")
    assert SECRET not in json.dumps(probe["env"])
    assert probe["env"]["GIVEN"] == "1"
    assert probe["env"]["HOME"] == probe["env"]["TMPDIR"] == str(paths.home)
    assert probe["cwd"] == str(paths.workspace)
    assert probe["own_session"]
    assert probe["pdeathsig"] == signal.SIGKILL
    assert not [fd for fd in probe["fds"] if "server-only" in fd]
    if weak.isolation.cgroups != "none":
        assert "/weak\n" in probe["cgroup"]
    assert weak.network_link("weak") is None


def test_weak_children_keep_a_home_the_caller_chose(weak: SandboxLauncher) -> None:
    for i, home in enumerate(("/custom/home", "/srv/home")):
        assert _weak_probe(weak, f"home{i}", {"HOME": home})["env"]["HOME"] == home
    # The sandbox's usual HOME, however the caller spelled it, is the child's own home directory.
    usual = "".join(["/home/", "agent"])
    assert _weak_probe(weak, "usual", {"HOME": usual})["env"]["HOME"] == str(weak.paths_for("usual").home)


def _bridge_answers(socket_path: Path) -> bool:
    """The bridge answered a `hello`: with socket activation the file is there before it runs."""
    async def hello() -> bool:
        try:
            conn = await BridgeConnection.connect(str(socket_path), timeout=60)
        except (SandboxError, OSError):
            return False
        await conn.close()
        return True

    return asyncio.run(hello())


def test_weak_children_run_the_bridge_when_no_argv_is_given(weak: SandboxLauncher) -> None:
    paths = weak.prepare("weak-bridge")
    proc = weak.launch(SandboxSpec("weak-bridge", paths))
    try:
        assert _bridge_answers(paths.bridge_socket), (paths.logs / "sandbox.log").read_text()
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(30)
        proc.cleanup()


def _host_mount_options(target: Path) -> list[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(target):
            return (fields[5] + "," + fields[fields.index("-") + 3]).split(",")
    return []


def test_a_leftover_disk_is_mounted_again_as_it_was(tmp_path: Path) -> None:
    """The start-up rescue: a disk whose mount was lost (a reboot) is mounted again, discard on;
    an old-layout workspace is found; an id with nothing left gives None."""
    require_isolation()
    with started_launcher(tmp_path, "bwrap") as launcher:
        paths = launcher.prepare("leftover", SMALL_DISK)
        (paths.workspace / "notes.txt").write_text("kept")
        subprocess.run(["umount", "-l", str(paths.disk)], check=True)  # what a reboot does
        assert launcher.mount_leftover("leftover") == paths.workspace
        assert (paths.workspace / "notes.txt").read_text() == "kept"
        assert "discard" in _host_mount_options(paths.disk)
        assert launcher.mount_leftover("leftover") == paths.workspace  # already mounted: as is
        old = launcher.sandboxes_dir / "sb-old" / "workspace"
        old.mkdir(parents=True)
        assert launcher.mount_leftover("sb-old") == old
        assert launcher.mount_leftover("never-made") is None
        launcher.destroy_dirs("leftover", keep_workspace=True)
        launcher.destroy_dirs("leftover", keep_workspace=True)  # again (a retried removal): no error
        assert (paths.workspace / "notes.txt").read_text() == "kept" and not paths.home.exists()
        launcher.destroy_dirs("leftover")
        launcher.destroy_dirs("leftover")
        assert not paths.root.exists()
        # An image that no longer mounts is an error, not "nothing to rescue": it may hold a session's
        # newest files, and the rescue keeps what it cannot read.
        broken = launcher.prepare("broken", SMALL_DISK)
        (broken.workspace / "notes.txt").write_text("behind a broken superblock")
        subprocess.run(["umount", "-l", str(broken.disk)], check=True)
        wait_for(lambda: not loop_devices_of(broken.image), 60)  # its last write is in before ours
        with open(broken.image, "r+b") as image:
            image.write(bytes(2 * MIB))  # the superblock is gone
        with pytest.raises(SandboxError, match="could not mount the sandbox disk"):
            launcher.mount_leftover("broken")
        assert broken.image.exists() and not is_mounted(broken.disk)


_NO_MKFS_START = """
import json, sys
from pathlib import Path
from ashd.errors import ConfigError
from ashd.sandboxing import LauncherConfig, SandboxLauncher
from tests.fixtures.sandboxes import TEST_LIMITS
root, out = Path(sys.argv[1]), {}
try:
    SandboxLauncher(LauncherConfig(root / "strict", TEST_LIMITS, use_zygote=False)).start()
    out["strict"] = "started"
except ConfigError as exc:
    out["strict"] = str(exc)
weak = SandboxLauncher(LauncherConfig(root / "weak", TEST_LIMITS, use_zygote=False, allow_weak_isolation=True))
weak.start()
try:
    out["weak"] = [weak.disk_quota, weak.isolation.disk_quota, weak.isolation.weak, weak.isolation.detail]
finally:
    weak.stop()
print(json.dumps(out))
"""


def test_a_host_that_cannot_make_disk_images_refuses_unless_weak_isolation_is_allowed(tmp_path: Path) -> None:
    """mkfs.ext4 hidden (a /dev/null bound over it, in a private mount namespace): the launcher
    refuses to start with the reason, or, with allow_weak_isolation, starts without a disk quota."""
    require_isolation()
    from ashd.sandboxing._disk import mkfs_path

    mkfs = mkfs_path()
    assert mkfs is not None
    hide = f'mount --bind /dev/null "$(readlink -f {mkfs})" && exec "$@"'
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh",
         sys.executable, "-c", _NO_MKFS_START, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["strict"].startswith("sandbox disk quotas (SERVICE_SANDBOX_DISK_MB=1024) need loop-mounted")
    assert "mkfs.ext4 not found" in out["strict"] and "SERVICE_SANDBOX_DISK_MB=0" in out["strict"]
    disk_quota, reported, weak, detail = out["weak"]
    assert (disk_quota, reported, weak) == (False, False, False)
    assert "; no disk quota: mkfs.ext4 not found" in detail


def test_programs_go_through_the_fork_server_even_when_its_payload_does_not_load(tmp_path: Path) -> None:
    require_isolation()
    with started_launcher(tmp_path, "zygote", zygote_payload="tests.no_such_module:main") as launcher:
        paths = launcher.prepare("program")
        proc = launcher.launch(SandboxSpec("program", paths,
                                           argv=(sys.executable, "-c", "import time; time.sleep(120)")))
        try:
            assert psutil.Process(proc.pid).ppid() != os.getpid()  # the zygote's monitor, not ours
        finally:
            proc.kill()
            proc.wait(30)
            proc.cleanup()


def test_the_zygote_runs_the_servers_own_ashd_not_the_environments(tmp_path: Path) -> None:
    """A server run from another copy of ashd (a checkout on PYTHONPATH, the mutation tests' copy)
    forks its sandboxes from that copy, though the zygote ignores the environment (`-I`)."""
    copy = tmp_path / "copy"
    # The ashd this test imported: the checkout, or the installed wheel (scripts/test_installed).
    shutil.copytree(Path(ashd.__file__).parent, copy / "ashd", ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import ashd, sys\n"
        "from pathlib import Path\n"
        "from ashd.sandboxing._zygote_client import ZygoteClient\n"
        f"z = ZygoteClient(Path({str(tmp_path / 'zygote.log')!r}))\n"
        "z.start()\n"
        "print(ashd.__file__, flush=True)\n"
        "z.stop()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(copy)},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(copy / "ashd" / "__init__.py")
