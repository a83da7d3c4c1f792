"""SandboxLauncher: probe, set up, launch (bwrap or zygote), stop.

Every process is started from one long-lived spawner thread. PR_SET_PDEATHSIG (bwrap's
--die-with-parent, and the zygote's own) fires when the *thread* that forked dies, so launching
straight from short-lived actor threads would kill sandboxes when an actor stops.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ashd.errors import ConfigError, SandboxError
from ashd.sandboxing import _layout as layout
from ashd.sandboxing._activation import bridge_listener
from ashd.sandboxing._bwrap import BWRAP, bwrap_argv, cgroup_wrapper
from ashd.sandboxing._cgroups import CgroupTree, SandboxCgroup
from ashd.sandboxing._disk import (
    MIB,
    ImageMaker,
    disk_quota_problems,
    is_mounted,
    mount_image,
    mount_leftover_image,
    mount_options,
    mounted_device,
    unmount,
)
from ashd.sandboxing._egress_policy import EgressPolicy, resolv_conf
from ashd.sandboxing._isolation import isolation_problems, probe_isolation
from ashd.sandboxing._netns import NETNS_DIR, SandboxLink
from ashd.sandboxing._network import SandboxNetworking
from ashd.sandboxing._process import CLEANUP_TIMEOUT, PopenChild, SandboxProcess
from ashd.sandboxing._reaper import reap_leftovers
from ashd.sandboxing._seccomp import SeccompPrograms, program_fd
from ashd.sandboxing._types import (
    SANDBOX_HOME,
    SANDBOX_WORKSPACE,
    IsolationReport,
    SandboxLimits,
    SandboxPaths,
    SandboxSpec,
)
from ashd.sandboxing._zygote_client import DEFAULT_PAYLOAD, ZygoteChild, ZygoteClient
from ashd.zygote import PASSED_FD

log = logging.getLogger(__name__)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
BRIDGE_ARGS = ("--socket", "/run/ashd/bridge.sock")
# How long the start-up rescue waits for a leftover disk image's loop device to let go (a lazily
# unmounted filesystem whose last user is still exiting); milliseconds on a quiet host.
LEFTOVER_DETACH_SECONDS = 10.0


@dataclass(frozen=True)
class LauncherConfig:
    data_dir: Path
    limits: SandboxLimits
    use_zygote: bool = True
    allow_weak_isolation: bool = False
    # "module:function" the zygote runs when spec.argv is None; called with BRIDGE_ARGS.
    zygote_payload: str = DEFAULT_PAYLOAD
    bwrap: str = BWRAP
    # What sandboxes that opt into network may reach (docs/security.md, "Network").
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Allocate each sandbox disk image whole when it is made (no overcommit of the data disk).
    preallocate_disk: bool = False


class SandboxLauncher:
    def __init__(self, config: LauncherConfig) -> None:
        self.config = config
        self._report: IsolationReport | None = None
        self._seccomp: SeccompPrograms | None = None
        self._cgroups: CgroupTree | None = None
        self._zygote: ZygoteClient | None = None
        self._network: SandboxNetworking | None = None
        self._spawner = self._new_spawner()
        self._running: dict[str, SandboxProcess] = {}
        self._lock = threading.Lock()
        self._started = False
        self._disk_quota = False
        self._images = ImageMaker(self.sandboxes_dir / ".disk-templates", config.limits.disk_bytes,
                                  preallocate=config.preallocate_disk)

    @staticmethod
    def _new_spawner() -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ashd-sandbox-spawner")

    @property
    def sandboxes_dir(self) -> Path:
        return self.config.data_dir / "sandboxes"

    @property
    def isolation(self) -> IsolationReport:
        if self._report is None:
            self._report = probe_isolation(
                bwrap=self.config.bwrap, allow_weak=self.config.allow_weak_isolation,
                bwrap_route=not self.config.use_zygote,
            )
        return self._report

    @property
    def weak(self) -> bool:
        return self.isolation.weak

    @property
    def disk_quota(self) -> bool:
        """Sandbox disks are size-limited images (SandboxLimits.disk_bytes), not plain directories."""
        return self._disk_quota

    # -- start / stop ----------------------------------------------------------------------------

    def start(self) -> None:
        bwrap_route = not self.config.use_zygote
        problems = isolation_problems(bwrap=self.config.bwrap, bwrap_route=bwrap_route)
        self._report = probe_isolation(bwrap=self.config.bwrap, allow_weak=self.config.allow_weak_isolation,
                                       bwrap_route=bwrap_route)
        if problems and not self.config.allow_weak_isolation:
            raise ConfigError(
                "this host cannot isolate sandboxes: "
                + "; ".join(problems)
                + ". Fix that, or set allow_weak_isolation (SERVICE_ALLOW_WEAK_ISOLATION=1) to run"
                " sandboxes as plain child processes without filesystem, network or uid isolation."
            )
        if problems:
            log.warning("WEAK SANDBOX ISOLATION: %s", "; ".join(problems))
        else:
            # Compiled once; every launch hands the same bytes to bwrap or the zygote.
            self._seccomp = SeccompPrograms.compile_all()
        self._start_disk_quota()
        self.sandboxes_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sandboxes_dir, 0o711)  # noqa: S103  (traverse only, no listing)
        if self._disk_quota:
            self._images.start()
        if not self.weak:
            layout.check_installation(self.config.data_dir)  # before anything is set up on the host
            self._network = SandboxNetworking(self.config.data_dir, self.config.egress)
            self._network.start()
            self._report = replace(self._report, network=self._network.status)
        else:
            self._report = replace(self._report, network="the host's network (weak isolation)")
        layout.write_etc_files(self.config.data_dir, resolv_conf(self._network.dns if self._network else ()))
        if self.isolation.cgroups != "none":
            self._cgroups = CgroupTree(self.config.data_dir)
            self._cgroups.setup()
            reap_leftovers(self.config.data_dir, self._cgroups)
        else:
            reap_leftovers(self.config.data_dir, None)
        if self.config.use_zygote and not self.weak:
            (self.sandboxes_dir / ".newroot").mkdir(mode=0o700, exist_ok=True)
            self._zygote = ZygoteClient(self.sandboxes_dir / "zygote.log", self.config.zygote_payload,
                                        detach_under=(str(self.sandboxes_dir), str(NETNS_DIR)))
            self._spawner.submit(self._zygote.start).result()
        self._started = True

    def _start_disk_quota(self) -> None:
        size_mb = self.config.limits.disk_bytes // MIB
        self._disk_quota = False
        if size_mb <= 0:
            log.warning("sandbox disk quota is off (SERVICE_SANDBOX_DISK_MB=0): a sandbox can fill the "
                        "data dir's filesystem")
            detail = "no disk quota (off)"
        elif self.weak:
            detail = "no disk quota (weak isolation)"
        elif problems := disk_quota_problems():
            if not self.config.allow_weak_isolation:
                raise ConfigError(
                    f"sandbox disk quotas (SERVICE_SANDBOX_DISK_MB={size_mb}) need loop-mounted ext4 images, "
                    "which this host cannot make: " + "; ".join(problems) + ". Fix that, or set "
                    "SERVICE_SANDBOX_DISK_MB=0 to run without a disk quota (a sandbox could then fill the "
                    "data dir's filesystem).")
            log.warning("WEAK SANDBOX ISOLATION: no sandbox disk quota: %s", "; ".join(problems))
            detail = "no disk quota: " + "; ".join(problems)
        else:
            self._disk_quota = True
            detail = f"disk quota {size_mb} MiB (loop-mounted ext4 images)"
        report = self.isolation
        self._report = dataclasses.replace(report, disk_quota=self._disk_quota,
                                           detail=f"{report.detail}; {detail}")

    def stop(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for proc in running:
            proc.kill()
            proc.cleanup()
        # The pool destroys its sandboxes before this; whatever is still mounted (a test's
        # sandbox, a destroy that failed) is unmounted, never deleted: the next start's rescue
        # mounts the image again.
        for disk in self.sandboxes_dir.glob("*/disk"):
            if is_mounted(disk):
                try:
                    unmount(disk)
                except SandboxError:
                    log.exception("could not unmount a sandbox disk at stop", extra={"path": str(disk)})
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        if self._network is not None:
            self._network.stop()
            self._network = None
        if self._cgroups is not None:
            self._cgroups.teardown()
        self._spawner.shutdown(wait=True)
        self._spawner = self._new_spawner()  # start() may be called again
        self._started = False

    # -- directories -----------------------------------------------------------------------------

    @property
    def zygote_pid(self) -> int | None:
        """The sandboxes' fork server's pid, None when there is none (operators' tools and tests)."""
        return self._zygote.pid if self._zygote is not None else None

    def process(self, sandbox_id: str) -> SandboxProcess | None:
        """The running sandbox with this id (operators' tools and tests), or None."""
        with self._lock:
            return self._running.get(sandbox_id)

    def paths_for(self, sandbox_id: str) -> SandboxPaths:
        if not _ID.match(sandbox_id):
            raise SandboxError(f"invalid sandbox id {sandbox_id!r}: use letters, digits, '_', '-', '.'")
        return SandboxPaths(self.sandboxes_dir / sandbox_id)

    def prepare(self, sandbox_id: str, disk_bytes: int | None = None) -> SandboxPaths:
        """The sandbox's directories, on a disk image of `disk_bytes` (default: the configured
        size) when disk quotas are on. Blocking: mkfs and mount take about 5 ms."""
        paths = self.paths_for(sandbox_id)
        paths.root.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.root, 0o711)  # noqa: S103  (traverse only, no listing)
        paths.disk.mkdir(exist_ok=True)
        size = self.config.limits.disk_bytes if disk_bytes is None else disk_bytes
        if self._disk_quota and size > 0 and not is_mounted(paths.disk):
            if not paths.image.exists():
                self._images.make(paths.image, size)
            mount_image(paths.image, paths.disk, discard=not self.config.preallocate_disk)
        os.chmod(paths.disk, 0o711)  # noqa: S103  (traverse only, no listing)
        for d in (paths.workspace, paths.home, paths.run):
            d.mkdir(exist_ok=True)
            if not self.weak:
                os.chown(d, layout.SANDBOX_UID, layout.SANDBOX_GID)
            os.chmod(d, 0o700)
        paths.tmp.mkdir(exist_ok=True)
        os.chmod(paths.tmp, 0o1777)  # noqa: S103  (the sandbox's /tmp: sticky, as on any host)
        paths.logs.mkdir(mode=0o700, exist_ok=True)
        return paths

    def mount_leftover(self, sandbox_id: str, wait_seconds: float = LEFTOVER_DETACH_SECONDS) -> Path | None:
        """The workspace a killed server left behind, its disk mounted again if it is not any more
        (a reboot): for the start-up rescue. None when there is no workspace to rescue; SandboxError
        when there may be one that cannot be read now (its image will not mount, or is still
        attached to the loop device of a filesystem being torn down): keep it, never delete it."""
        paths = self.paths_for(sandbox_id)
        if paths.image.exists() and not is_mounted(paths.disk):
            paths.disk.mkdir(exist_ok=True)
            mount_leftover_image(paths.image, paths.disk, discard=not self.config.preallocate_disk,
                                 wait_seconds=wait_seconds)
        if paths.workspace.is_dir():
            return paths.workspace
        legacy = paths.root / "workspace"  # left by a version before sandbox disks
        return legacy if legacy.is_dir() else None

    def destroy_dirs(self, sandbox_id: str, keep_workspace: bool = False) -> None:
        paths = self.paths_for(sandbox_id)
        if not keep_workspace:
            # Unmount first: removing the tree through the mount would be slow and leave it mounted.
            unmount(paths.disk)
            shutil.rmtree(paths.root, ignore_errors=True)
            return
        for d in (paths.home, paths.run, paths.logs, paths.tmp):
            shutil.rmtree(d, ignore_errors=True)

    # -- launch ----------------------------------------------------------------------------------

    def launch(self, spec: SandboxSpec) -> SandboxProcess:
        if not self._started:
            raise SandboxError("the sandbox launcher is not started")
        spec.paths.logs.mkdir(parents=True, exist_ok=True)
        cgroup = self._cgroups.create(spec.sandbox_id, spec.limits) if self._cgroups else None
        oom_before = cgroup.oom_kills() if cgroup else 0
        try:
            # Weak isolation has no namespaces at all: its sandboxes share the host's network.
            netns = None
            if spec.network and self._network is not None:
                netns = self._network.attach(spec.sandbox_id).netns_path
            # The bridge's socket, listening before the sandbox starts (`_activation`); a program
            # of the caller's own (`spec.argv`) gets none.
            listener = bridge_listener(spec.paths.bridge_socket) if spec.argv is None else None
            try:
                child = self._spawner.submit(self._spawn, spec, cgroup, netns, listener).result()
            finally:
                if listener is not None:
                    listener.close()  # the sandbox holds it now: it dies with the sandbox
        except BaseException:
            if cgroup is not None:
                cgroup.kill_and_remove(CLEANUP_TIMEOUT)
            if self._network is not None:
                self._network.release(spec.sandbox_id)
            raise
        proc = SandboxProcess(
            spec.sandbox_id,
            child,
            paths=spec.paths,
            cgroup=cgroup,
            isolated=not self.weak,
            init_is_payload=isinstance(child, ZygoteChild) and spec.argv is None,
            oom_kills_before=oom_before,
            on_cleanup=self._forget,
            limits=spec.limits,
            disk_quota=self._disk_quota and is_mounted(spec.paths.disk),
        )
        with self._lock:
            self._running[spec.sandbox_id] = proc
        return proc

    def _forget(self, proc: SandboxProcess) -> None:
        """Called once the sandbox's processes are gone (SandboxProcess.cleanup)."""
        with self._lock:
            if self._running.get(proc.sandbox_id) is proc:
                del self._running[proc.sandbox_id]
        if self._network is not None:
            self._network.release(proc.sandbox_id)

    def network_link(self, sandbox_id: str) -> SandboxLink | None:
        """The network of a running networked sandbox (operators' tools and tests), or None."""
        return self._network.link(sandbox_id) if self._network is not None else None

    def _spawn(
        self, spec: SandboxSpec, cgroup: SandboxCgroup | None, netns: str | None, listener: socket.socket | None
    ) -> PopenChild | ZygoteChild:
        log_path = spec.paths.logs / "sandbox.log"
        listen_fd = listener.fileno() if listener is not None else None
        if self.weak:
            return self._spawn_weak(spec, cgroup, log_path, listen_fd)
        env = layout.sandbox_env(spec.env)
        plan = layout.mount_plan(spec, self.config.data_dir)
        if self._zygote is not None and (spec.argv is not None or self._zygote.has_payload):
            if not self._zygote.alive():
                log.warning("sandbox zygote died; restarting it")
                self._zygote.start()
            request = self._zygote_request(spec, cgroup, env, plan, log_path, netns)
            if listen_fd is not None:
                request["payload_args"] += ["--listen-fd", str(PASSED_FD)]
            return self._zygote.spawn(request, pass_fd=listen_fd)
        argv = spec.argv if spec.argv is not None else layout.default_argv(listen_fd)
        fd = program_fd(self._program(spec))
        try:
            cmd = bwrap_argv(plan, env, argv, netns=netns, seccomp_fd=fd, bwrap=self.config.bwrap)
            if cgroup is not None:
                cmd = cgroup_wrapper(cgroup.join_files, cmd)
            return self._popen(cmd, {}, "/", log_path, pass_fds=(fd,) if listen_fd is None else (fd, listen_fd))
        finally:
            os.close(fd)

    def _program(self, spec: SandboxSpec) -> bytes:
        if self._seccomp is None:
            raise SandboxError("the sandbox launcher has no seccomp filters (it was not started)")
        return self._seccomp.program(spec.seccomp)

    def _zygote_request(
        self,
        spec: SandboxSpec,
        cgroup: SandboxCgroup | None,
        env: dict[str, str],
        plan: list[layout.Mount],
        log_path: Path,
        netns: str | None,
    ) -> dict[str, Any]:
        return {
            "argv": list(spec.argv) if spec.argv is not None else None,
            "payload_args": list(BRIDGE_ARGS),
            # The bridge is the sandbox's pid 1 and reaps its orphans itself (ashd/zygote/_child.py).
            "payload_is_init": spec.argv is None,
            "env": env,
            "cwd": SANDBOX_WORKSPACE,
            # Opened by the sandbox before its own mounts, in the zygote's mount namespace, which
            # has neither the disk nor the netns: through this server's view of the tree.
            "netns": _seen_by_server(netns) if netns else None,
            "disk": self._disk_request(spec),
            "plan": [m.to_json() for m in plan],
            "newroot": str(self.sandboxes_dir / ".newroot"),
            "cgroup_join": [str(p) for p in cgroup.join_files] if cgroup else [],
            "cgroup_dir": str(cgroup.dirs["unified"]) if cgroup and cgroup.version == "v2" else None,
            "log": _seen_by_server(str(log_path)),
            "seccomp": self._program(spec).hex(),
        }

    def _disk_request(self, spec: SandboxSpec) -> dict[str, Any] | None:
        """What the sandbox needs to mount its disk itself (`ashd/zygote/_child.py`): the device the
        server mounted on `paths.disk`, none when the sandbox has no disk of its own."""
        found = mounted_device(spec.paths.disk) if self._disk_quota else None
        if found is None:
            return None
        device, dev = found
        return {"source": device, "target": str(spec.paths.disk), "fstype": "ext4", "dev": dev,
                "options": mount_options(discard=not self.config.preallocate_disk)}

    def _spawn_weak(self, spec: SandboxSpec, cgroup: SandboxCgroup | None, log_path: Path,
                    listen_fd: int | None) -> PopenChild:
        """No namespaces: a plain child with a clean env, its own cwd and session."""
        env = layout.sandbox_env(spec.env)
        env.setdefault("HOME", str(spec.paths.home))
        if env["HOME"] == SANDBOX_HOME:
            env["HOME"] = str(spec.paths.home)
        env["TMPDIR"] = str(spec.paths.home)
        argv = (
            list(spec.argv)
            if spec.argv is not None
            else [*layout.default_argv()[:-1], str(spec.paths.bridge_socket),
                  *(() if listen_fd is None else ("--listen-fd", str(listen_fd)))]
        )
        if os.access("/usr/bin/setpriv", os.X_OK):
            argv = ["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", *argv]
        if cgroup is not None:
            argv = cgroup_wrapper(cgroup.join_files, argv)
        return self._popen(argv, env, str(spec.paths.workspace), log_path,
                           pass_fds=() if listen_fd is None else (listen_fd,))

    @staticmethod
    def _popen(
        argv: list[str], env: dict[str, str], cwd: str, log_path: Path, pass_fds: tuple[int, ...] = ()
    ) -> PopenChild:
        with open(log_path, "ab") as logf:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                close_fds=True,
                pass_fds=pass_fds,
            )
        return PopenChild(popen)


def _seen_by_server(path: str) -> str:
    """`path` as this server sees it, from any mount namespace on the host: through its own root
    (the zygote's namespace, `private_mount_namespace`, lacks what the server mounted since).
    Resolved here first: an absolute symlink on the way (a data dir linked elsewhere) would be
    followed from the opener's root, in the opener's namespace."""
    return f"/proc/{os.getpid()}/root{os.path.realpath(path)}"
