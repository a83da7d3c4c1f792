"""The seccomp filters of sandbox processes: compiled once at server start, loaded by both routes.

libseccomp (through pyseccomp, a ctypes binding of the system's libseccomp2) turns the profile in
`_seccomp_profile` into a classic BPF program. The server exports the program's bytes once per
profile; bubblewrap loads them with `--seccomp FD`, the zygote child with seccomp(2) right before
the payload runs. Nothing is assembled by hand.

Choices beyond the profile's allowlist, each what runc or bubblewrap do too:
- A denied call fails with EPERM; no rule ever kills a process.
- Syscall numbers this libseccomp does not know (newer than its tables) answer ENOSYS, so a
  program probing a new call falls back the way it would on an older kernel.
- Only the host's native architecture is allowed; a 32-bit or x32 syscall fails with EPERM (their
  compat entry points are a separate, historically buggy, attack surface).
- The binary-tree layout keeps the cost per syscall at a handful of comparisons.
"""

from __future__ import annotations

import errno
import os
import platform
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ashd.sandboxing import _seccomp_profile as profile

# Syscall numbers below this bound that libseccomp cannot name get ENOSYS (see the module doc).
_ENOSYS_BELOW = 512


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its binding) is missing, or this architecture is not supported."""


def _binding() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding found no libseccomp
        raise SeccompUnavailable(
            f"libseccomp is not usable ({exc}); install the libseccomp2 package (apt-get install libseccomp2)"
        ) from exc
    return pyseccomp


def check_available() -> None:
    """Raise SeccompUnavailable, naming what to install, when no filter can be built here."""
    _binding()
    if platform.machine() not in profile.ARCH_ALLOW:
        raise SeccompUnavailable(f"no seccomp profile for the {platform.machine()} architecture")


def _allow(f: Any, sc: Any, name: str, *args: Any) -> None:
    """Allow a call by name; names this libseccomp or architecture lacks are skipped, as runc does."""
    if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
        return
    f.add_rule(sc.ALLOW, name, *args)


def _rules(f: Any, sc: Any, name: str) -> None:
    machine = platform.machine()
    if machine not in profile.ARCH_ALLOW:
        raise SeccompUnavailable(f"no seccomp profile for the {machine} architecture")
    for call in (*profile.DOCKER_ALLOW, *profile.ARCH_ALLOW[machine]):
        _allow(f, sc, call)
    _allow(f, sc, "socket", sc.Arg(0, sc.NE, profile.AF_VSOCK))
    personas: Iterable[int] = profile.PERSONALITY_ALLOW
    if name == "ptrace":
        personas = (*personas, profile.ADDR_NO_RANDOMIZE)
        for call in profile.PTRACE_CALLS:
            _allow(f, sc, call)
    for persona in personas:
        _allow(f, sc, "personality", sc.Arg(0, sc.EQ, persona))
    _allow(f, sc, "clone", sc.Arg(0, sc.MASKED_EQ, profile.CLONE_NAMESPACE_FLAGS, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for nr in range(_ENOSYS_BELOW):
        try:
            sc.resolve_syscall(sc.Arch.NATIVE, nr)
        except ValueError:
            f.add_rule(sc.ERRNO(errno.ENOSYS), nr)


def build(name: str) -> bytes:
    """The BPF program (an array of `struct sock_filter`) of one profile."""
    if name not in profile.PROFILES:
        raise ValueError(f"unknown seccomp profile {name!r}; known: {', '.join(profile.PROFILES)}")
    sc = _binding()
    f = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    f.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.EPERM))
    f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # binary tree
    _rules(f, sc, name)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@dataclass(frozen=True)
class SeccompPrograms:
    """Every profile, compiled once. `None` programs mean no filter (weak isolation only)."""

    programs: Mapping[str, bytes]

    @classmethod
    def compile_all(cls) -> SeccompPrograms:
        return cls(MappingProxyType({name: build(name) for name in profile.PROFILES}))

    def program(self, name: str) -> bytes:
        try:
            return self.programs[name]
        except KeyError:
            raise ValueError(f"unknown seccomp profile {name!r}") from None


def program_fd(program: bytes) -> int:
    """A fresh fd holding the program, at offset 0, for bwrap's `--seccomp FD` (it reads to EOF and
    closes it). One per launch: a shared fd would share its file offset between launches."""
    fd = os.memfd_create("ashd-seccomp")  # close-on-exec: only pass_fds hands it to bwrap
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
