"""What the sandbox seccomp filter and the two-stage bwrap cost. Prints figures; asserts nothing.

    .venv/bin/python scripts/bench_seccomp.py [--n 200]

1. Compiling each profile with libseccomp (once per server start).
2. Loading the filter in a fresh process: fork + no_new_privs + filter + exit, against fork +
   no_new_privs + exit (alternating, so both see the same load).
3. The filter's cost per system call: a loop of stat("/") in a child with and without it.
4. bubblewrap: a bare /bin/true through the former single root bwrap (+ setpriv) and through the
   two stages the launcher now builds (root bwrap, root sh, setpriv, unprivileged bwrap with its
   user namespace, --disable-userns and --seccomp). Run as root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from ashd.sandboxing import _seccomp
from ashd.sandboxing._bwrap import BWRAP, bwrap_argv, drop_privileges_argv
from ashd.sandboxing._layout import Mount
from ashd.zygote._child import PR_SET_NO_NEW_PRIVS, _prctl, install_seccomp

SYSTEM = [Mount("ro-bind", "/usr", "/usr"), Mount("symlink", "/bin", "usr/bin"), Mount("symlink", "/lib", "usr/lib"),
          Mount("symlink", "/lib64", "usr/lib64"), Mount("symlink", "/sbin", "usr/sbin"), Mount("dir", "/run"),
          Mount("dev", "/dev"), Mount("proc", "/proc"), Mount("tmpfs", "/tmp"), Mount("dir", "/workspace")]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(name: str, ms: list[float]) -> None:
    print(f"{name:58s} n={len(ms):4d}  p50 {statistics.median(ms):8.3f} ms  p90 {pct(ms, 0.9):8.3f} ms")


def in_child(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return (time.perf_counter() - t) * 1000


def stat_loop(program: bytes | None, calls: int, out: int) -> None:
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if program is not None:
        install_seccomp(program)
    t = time.perf_counter_ns()
    for _ in range(calls):
        os.stat("/")
    os.write(out, str((time.perf_counter_ns() - t) / calls).encode())


def per_call_ns(program: bytes | None, calls: int) -> float:
    r, w = os.pipe()
    in_child(lambda: stat_loop(program, calls, w))
    os.close(w)
    with os.fdopen(r) as f:
        return float(f.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()

    for name in ("default", "ptrace"):
        ms = []
        for _ in range(20):
            t = time.perf_counter()
            program = _seccomp.build(name)
            ms.append((time.perf_counter() - t) * 1000)
        show(f"compile profile {name!r} ({len(program) // 8} BPF instructions)", ms)

    program = _seccomp.SeccompPrograms.compile_all().program("default")
    bare: list[float] = []
    filtered: list[float] = []

    def no_new_privs() -> None:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)

    def no_new_privs_and_filter() -> None:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        install_seccomp(program)

    for _ in range(args.n):
        bare.append(in_child(no_new_privs))
        filtered.append(in_child(no_new_privs_and_filter))
    show("fork + no_new_privs + exit", bare)
    show("fork + no_new_privs + seccomp filter + exit", filtered)

    plain: list[float] = []
    with_filter: list[float] = []
    for _ in range(9):  # alternating, so both see the same load
        plain.append(per_call_ns(None, 200_000))
        with_filter.append(per_call_ns(program, 200_000))
    label = 'stat("/") from Python, per call'
    print(f"{label:58s} without filter {statistics.median(plain):7.0f} ns, "
          f"with filter {statistics.median(with_filter):7.0f} ns")

    if os.geteuid() != 0:
        print("not root: skipping the bwrap comparison")
        return
    one = [BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
           "--new-session", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib",
           "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--",
           *drop_privileges_argv(["/bin/true"])]
    single: list[float] = []
    double: list[float] = []
    for _ in range(max(10, args.n // 5)):
        for cmd, out in ((one, single), (None, double)):
            fd = _seccomp.program_fd(program)
            argv = cmd or bwrap_argv(SYSTEM, {}, ["/bin/true"], netns=None, seccomp_fd=fd)
            t = time.perf_counter()
            subprocess.run(argv, check=True, pass_fds=(fd,), stdin=subprocess.DEVNULL)
            out.append((time.perf_counter() - t) * 1000)
            os.close(fd)
    show("bwrap: one root stage + setpriv, /bin/true (before)", single)
    show("bwrap: two stages + userns + seccomp, /bin/true (now)", double)


if __name__ == "__main__":
    main()
