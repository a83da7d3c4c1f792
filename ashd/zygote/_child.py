"""What a zygote's forked child does to become a sandbox equivalent to the bwrap route.

    zygote ── clone(CLONE_NEWPID) ──► init (pid 1 of a new pid namespace; the host pid we report):
                         joins the cgroups, joins the sandbox's prepared network namespace if it
                         has one, unshares the other namespaces (and a new, empty network
                         namespace otherwise), private mounts, tmpfs root, the same mount plan as
                         bwrap, pivot_root, read-only /, forks, then drops to uid/gid 65534 with no
                         capabilities, no_new_privs, not dumpable, the seccomp filter, and reaps
                        └──► payload (pid 2): setsid, drops every capability, uid/gid 65534,
                               no_new_privs, clean env, cwd /workspace, the seccomp filter last,
                               runs the program
Nothing in the sandbox's pid namespace stays root, as with bubblewrap's own init. The zygote is
the init's parent and reaps it: there is no host-side monitor process between them, which is one
forked interpreter (about 1.5 MiB of private pages) less per sandbox (docs/performance.md).

The bridge (`payload_is_init` in the request) is its sandbox's pid 1 itself: the init drops its
privileges and runs it instead of forking it, and the bridge reaps the orphans that pid 1 inherits
(`ashd/bridge/_reaper.py`). A second copy of the fork server's image per sandbox cost a page-table
copy at its fork, copy-on-write faults and an unmap at its exit: about 9 ms of CPU per sandbox
(docs/performance.md, twenty-fifth pass). A program of the caller's own keeps the reaping init.
Runs in a forked copy of a single-threaded zygote, so only async-signal-safe-ish work is done and
every failure ends in os._exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import platform
import re
import runpy
import signal
import socket
import stat
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

from ashd.zygote._mounts import HOSTNAME, SANDBOX_GID, SANDBOX_UID, Mount

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine(), 155)
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine(), 56)
SYS_CLONE3 = 435  # the same number on x86_64 and aarch64
CLONE_INTO_CGROUP = 0x200000000  # clone3 only, cgroup v2 only, Linux 5.7+
# The character devices a sandbox's /dev holds (major, minor: Documentation/admin-guide/devices.txt).
DEV_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}

_libc = ctypes.CDLL(None, use_errno=True)
# Called with the GIL held, as os.fork calls fork(): the child must not start without it.
_libc_gil = ctypes.PyDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    result = _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _join_netns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns {path}")
    finally:
        os.close(fd)


def _ensure_dir(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chmod(path, 0o755)  # noqa: S103  (system dirs of the sandbox root, as bwrap makes them)


def _bind(src: str, target: str, *, readonly: bool, nodev: bool = True) -> None:
    if os.path.isdir(src):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.exists(target):
            with open(target, "w"):
                pass
    _mount(src, target, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (MS_NODEV if nodev else 0) | (MS_RDONLY if readonly else 0)
    _mount(None, target, None, flags)


def _make_nodes(target: str) -> bool:
    """The device nodes made in place, as devtmpfs has them; False where mknod is refused (a
    device cgroup that does not allow it, no CAP_MKNOD), with nothing left behind."""
    try:
        for node, (major, minor) in DEV_NODES.items():
            os.mknod(f"{target}/{node}", stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(f"{target}/{node}", 0o666)  # noqa: S103  (as the host has them; the umask took some)
    except PermissionError:
        for node in DEV_NODES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{target}/{node}")
        return False
    return True


def _make_dev(target: str) -> None:
    _ensure_dir(target)
    # Not nodev: its nodes are made in it, one mknod each where a bind of the host's node took two
    # mounts that the namespace's end unmounts again (0.4 ms less per sandbox, docs/performance.md).
    # Only root can write to it (0755); the sandbox user has no CAP_MKNOD anyway.
    _mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=0755")
    if not _make_nodes(target):
        for node in DEV_NODES:  # the host's nodes, bound as bwrap's --dev does
            _bind(f"/dev/{node}", f"{target}/{node}", readonly=False, nodev=False)
    for name, dest in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(dest, f"{target}/{name}")
    # POSIX shared memory and semaphores (Python multiprocessing, Chromium) need a writable
    # /dev/shm, as on a host; what it holds is charged to the sandbox's memory cgroup.
    os.makedirs(f"{target}/shm", mode=0o755)
    _mount("tmpfs", f"{target}/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777")
    os.makedirs(f"{target}/pts", mode=0o755)
    with contextlib.suppress(OSError):  # no pty support is not fatal, as with bwrap
        opts = "newinstance,ptmxmode=0666,mode=620"
        _mount("devpts", f"{target}/pts", "devpts", MS_NOSUID | MS_NOEXEC, opts)


def apply_plan(plan: list[Mount], root: str) -> None:
    for m in plan:
        target = root + m.dest
        if m.kind == "dir":
            _ensure_dir(target)
        elif m.kind == "symlink":
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            os.symlink(m.src, target)
        elif m.kind in ("ro-bind", "bind"):
            _bind(m.src, target, readonly=m.kind == "ro-bind")
        elif m.kind == "tmpfs":
            _ensure_dir(target)
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
        elif m.kind == "proc":
            _ensure_dir(target)
            _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif m.kind == "dev":
            _make_dev(target)
        else:
            raise ValueError(f"unknown mount kind {m.kind!r}")


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


# A sandbox's disk (`SandboxPaths.disk`) under any data dir: this server's or another's on the host.
_ANY_SANDBOX_DISK = re.compile(r"/sb-[0-9a-f]{16}/disk(/|$)")


def mount_points_under(folders: list[str]) -> list[str]:
    """The mount points strictly below any of `folders` in this mount namespace, and every ashd
    sandbox's disk wherever it is, deepest first."""
    prefixes = tuple(os.path.realpath(f).rstrip("/") + "/" for f in folders)  # as mountinfo shows them
    with open("/proc/self/mountinfo") as f:
        points = [_unescape_mountinfo(line.split()[4]) for line in f]
    return sorted({p for p in points if p.startswith(prefixes) or _ANY_SANDBOX_DISK.search(p)},
                  key=len, reverse=True)


def private_mount_namespace(detach_under: list[str]) -> None:
    """The fork server's own mount namespace: a copy of the host's as it is now, that receives
    nothing the server mounts later (a sandbox's disk, a networked sandbox's netns) and holds none
    of those mounted before (a restart's), detached here.

    Why: each sandbox's `unshare(CLONE_NEWNS)` copies its parent's mount table, makes every entry
    private and detaches them all again at `pivot_root`: work per mount, per sandbox. In the host's
    namespace that table holds every live sandbox's disk, so a create cost more the more sessions
    were held (docs/performance.md, twenty-sixth pass). A sandbox mounts its own disk by its device
    instead (`_mount_disk`), and what it opens before its own mounts goes through the server's view
    of the tree (the launcher's `/proc/<server>/root/...` paths).

    The disks of another ashd on the host (a second service, a test beside this one) go too: a
    private copy of a mount holds its filesystem, and so its loop device and the space of its
    deleted image, until this namespace ends, whatever the other server unmounts; a restart of that
    server after a kill would wait for the image to let go, and keep it unread (docs/operations.md)."""
    _unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for point in mount_points_under(detach_under):
        _libc.umount2(point.encode(), MNT_DETACH)  # one below another already detached: EINVAL, harmless


def _mount_disk(disk: dict[str, Any] | None) -> None:
    """The sandbox's disk, mounted in its own namespace by the device the server attached and
    mounted it from: the same filesystem (one superblock), not a second instance of it."""
    if not disk:
        return
    _mount(disk["source"], disk["target"], disk["fstype"], MS_NOSUID | MS_NODEV, disk["options"])
    if os.stat(disk["target"]).st_dev != disk["dev"]:
        raise RuntimeError(f"{disk['source']} is not the sandbox's disk any more")


def _enter_root(newroot: str) -> None:
    _mount("tmpfs", newroot, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    os.chdir(newroot)


def _pivot(newroot: str) -> None:
    os.chdir(newroot)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _exit_like(status: int) -> None:
    """Die the way bwrap reports its payload's end: its exit code, or 128+N for death by signal N."""
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _wait_for(pid: int) -> int:
    """Reap everything (we are a pid 1) until `pid` itself has exited."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1 << 8
        if done == pid:
            return status


def _become_sandbox_user() -> None:
    """uid/gid 65534 in all three slots, no supplementary groups, an empty bounding set and (the
    uid change clears them) no capabilities, no_new_privs."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(SANDBOX_GID, SANDBOX_GID, SANDBOX_GID)
    os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _drop_privileges() -> None:
    _become_sandbox_user()
    # setuid cleared "dumpable" (no exec follows, unlike bwrap's route): without it /proc/self/*
    # stays root-owned and the payload could not even read its own /proc/self/fd.
    _prctl(PR_SET_DUMPABLE, 1)


def _drop_init_privileges() -> None:
    """pid 1 after it forked the payload: what bubblewrap's init holds, nothing more.

    It stays not dumpable, so its /proc/1 stays root's and a payload of the same uid can neither
    read its memory nor (ptrace is also filtered) attach to it. Dumpable is inherited on fork,
    which is why this happens only after the payload was forked. The uid change clears the
    parent-death signal, so it is armed again: init dies with the zygote.
    """
    _become_sandbox_user()
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program: bytes) -> None:
    """Load a BPF program exported by the server (an array of 8-byte `struct sock_filter`).
    Needs no_new_privs, which the caller set. Last step before the payload: it filters us too."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    result = _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog),
                         ctypes.c_ulong(0), ctypes.c_ulong(0))
    _check(result, "seccomp filter")


def _loopback_up() -> None:
    """A new network namespace starts with `lo` down; bwrap brings it up, so do we."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _run_payload(req: dict[str, Any], entry: Callable[[list[str]], object] | None) -> None:
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    os.environ.setdefault("PWD", req["cwd"])  # as bwrap's --chdir does
    argv: list[str] | None = req["argv"]
    if argv is None:
        if entry is None:
            raise RuntimeError("the zygote has no payload entry function")
        sys.argv = ["ashd.bridge", *req["payload_args"]]
        result = entry(list(req["payload_args"]))
        raise SystemExit(result if isinstance(result, int) else 0)
    if os.path.basename(argv[0]).startswith("python"):
        # Run Python programs in this pre-warmed interpreter instead of a fresh exec.
        args = list(argv[1:])
        while args and args[0] in ("-I", "-S", "-u", "-B", "-E", "-s"):
            args.pop(0)
        if args[:1] == ["-c"] and len(args) >= 2:
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102  (python -c)
            return
        if args[:1] == ["-m"] and len(args) >= 2:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            return
        if args and not args[0].startswith("-"):
            sys.argv = args
            sys.path[0:0] = [os.path.dirname(os.path.abspath(args[0]))]
            runpy.run_path(args[0], run_name="__main__")
            return
    os.execvpe(argv[0], argv, req["env"])  # noqa: S606  (argv is the caller's program, no shell)


def _payload_main(req: dict[str, Any], entry: Callable[[list[str]], object] | None, gate: int | None) -> None:
    """The payload's process: pid 2 below a reaping init (`gate` given), or the init itself."""
    code = 0
    try:
        if gate is not None:
            os.setsid()  # as the init is: a session of its own
        _drop_privileges()
        if gate is None:  # the init itself: the uid change cleared its death signal, armed again
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        install_seccomp(bytes.fromhex(req["seccomp"]))  # a request without a filter fails closed
        if gate is not None:
            os.read(gate, 1)  # end of file once pid 1 is no longer root (`_init_main`)
            os.close(gate)
        _run_payload(req, entry)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  (a forked child must never return into the zygote)
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _init_main(req: dict[str, Any], entry: Callable[[list[str]], object] | None) -> None:
    _check(_libc.sethostname(HOSTNAME.encode(), len(HOSTNAME)), "sethostname")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount_disk(req.get("disk"))
    _loopback_up()  # a new netns starts with `lo` down (bwrap brings it up too)
    newroot = req["newroot"]
    _enter_root(newroot)
    apply_plan([Mount.from_json(m) for m in req["plan"]], newroot)
    _pivot(newroot)
    if req.get("payload_is_init"):
        _payload_main(req, entry, None)  # never returns
    # pid 1 forks the payload as root (the payload drops its own privileges), then drops its own.
    # The payload waits on `gate` until that is done: on a loaded host pid 1 could otherwise still
    # be root, unfiltered, while the payload already runs (seen: the payload listening beside a
    # root pid 1).
    gate, opened = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(opened)
        _payload_main(req, entry, gate)
    os.close(gate)
    _drop_init_privileges()
    install_seccomp(bytes.fromhex(req["seccomp"]))
    os.close(opened)
    _exit_like(_wait_for(pid))


class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
        "set_tid", "set_tid_size", "cgroup")]


def fork_into_new_pid_namespace(cgroup_fd: int | None = None) -> int:
    """`os.fork()` whose child is the pid 1 of a new pid namespace; the child's host pid, or 0 in it.

    `unshare(CLONE_NEWPID)` would need a process that unshares and then forks (what the monitor
    did), because it applies to the caller's children only, and only once. `clone()` with the flag
    makes that child directly. CPython's own fork hooks run around it as `os.fork()` runs them.

    With `cgroup_fd` (a cgroup v2 directory) the child is born in that cgroup (clone3 with
    CLONE_INTO_CGROUP), which costs nothing, where a later write to cgroup.procs waits out an RCU
    grace period (6 ms p50). OSError(ENOSYS, EINVAL, ...) where the kernel cannot: nothing forked.
    """
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    if cgroup_fd is None:
        pid = _libc_gil.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong(CLONE_NEWPID | signal.SIGCHLD),
                                ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    else:
        # stack 0: the child runs on a copy of this stack, as after fork().
        args = _CloneArgs(flags=CLONE_NEWPID | CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cgroup_fd)
        pid = _libc_gil.syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def _host_parent_pid() -> int:
    """Our parent's pid as the host sees it. `os.getppid()` is 0 in a new pid namespace, but /proc
    is still the host's until the mount plan replaces it."""
    with open("/proc/self/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def sandbox_main(req: dict[str, Any], zygote_pid: int, entry: Callable[[list[str]], object] | None) -> None:
    """Entry of the zygote's child (pid 1 of its new pid namespace); never returns."""
    try:
        os.setsid()
        for path in [] if req.get("born_in_cgroup") else req["cgroup_join"]:
            with open(path, "w") as f:
                f.write("0")  # "the writer", on v1 and v2: our own pid here is 1
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if _host_parent_pid() != zygote_pid:
            os._exit(1)  # the zygote died before the death signal was armed
        flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
        # Never the host's network: the prepared namespace of a networked sandbox, or a new one.
        if req.get("netns"):
            _join_netns(req["netns"])
        else:
            flags |= CLONE_NEWNET
        _unshare(flags)
        _init_main(req, entry)
    except BaseException:  # noqa: BLE001  (never return into the zygote)
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(127)


def redirect_stdio(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)


PASSED_FD = 3  # where the one fd a spawn request passed ends up (the bridge's `--listen-fd`)


def reset_after_fork(sock: socket.socket, fds: list[int], keep: int | None = None) -> None:
    """Drop the zygote's fds (closing Python objects properly, so a later GC cannot close a
    reused fd number) and signal set-up; `keep`, the fd the request passed, becomes fd 3."""
    signal.set_wakeup_fd(-1)
    if keep is not None and keep != PASSED_FD:
        os.dup2(keep, PASSED_FD)  # whatever fd 3 was in the zygote (closed below anyway) is replaced
        os.close(keep)
    if keep is not None and sock.fileno() == PASSED_FD:
        sock.detach()  # its number now holds the passed fd; the zygote's copy of the socket stays its own
    else:
        sock.close()
    for fd in fds:
        if fd != PASSED_FD or keep is None:
            os.close(fd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    os.closerange(3 if keep is None else PASSED_FD + 1, 65536)
