"""Which host folders a tenant may register as an agent by `path`, and opening them without races.

Policy (docs/security.md, "Agent folders"):

- Never `/proc`, `/sys`, `/dev`, the server's data directory, or a folder that contains the data
  directory, whether named directly or reached through symlinks. The one part of the data dir that
  may hold agent folders is `<data dir>/library/`, which the server never writes.
- Tenant `default` (the operator's own tenant): any other folder; only under SERVICE_AGENT_ROOTS
  (or the library) when that is set.
- Every other tenant: only its own folder of a root, `<root>/<tenant>/` for a root of
  SERVICE_AGENT_ROOTS or the library. A tenant cannot name another tenant's folder, nor any host
  folder, and learns nothing about paths outside its own: every refusal there is the same answer.

A deploy stores the folder's canonical path (no symlinks). Each later use checks the policy again
and opens that path one component at a time without following any symlink (`open_dir`), so a
folder swapped for a link after the deploy, or between the check and the copy, is refused instead
of followed. Error messages repeat the path the caller sent, never what it resolved to.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ashd.errors import BadRequest, NotFound
from ashd.storage._files import JSON_LIMIT, DirectoryReader, FileEntry, list_files, open_file

LIBRARY_DIR = "library"
SYSTEM_PREFIXES = (Path("/proc"), Path("/sys"), Path("/dev"))
SYSTEM_PROMPT_FILE = "AGENT.md"
DEFAULT_TENANT = "default"
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def tenant_dir_name(tenant: str) -> str:
    """A directory name for a tenant id that is safe whatever the id contains."""
    if _PLAIN_NAME.match(tenant):
        return tenant
    return "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:32]


def _under(path: Path, base: Path) -> bool:
    return path == base or path.is_relative_to(base)


@dataclass(frozen=True)
class AgentPathPolicy:
    data_dir: Path  # resolved
    roots: tuple[Path, ...] = ()  # resolved SERVICE_AGENT_ROOTS; empty: unset

    @property
    def library(self) -> Path:
        return self.data_dir / LIBRARY_DIR

    def _forbidden(self, real: Path) -> bool:
        if any(_under(real, p) for p in SYSTEM_PREFIXES):
            return True
        if _under(self.data_dir, real):  # the data dir itself, or a folder that contains it
            return True
        return _under(real, self.data_dir) and not _under(real, self.library)

    def _in_scope(self, real: Path, tenant: str) -> bool:
        bases = (*self.roots, self.library)
        if tenant == DEFAULT_TENANT:
            return not self.roots or any(_under(real, b) for b in bases)
        own = tenant_dir_name(tenant)
        return any(_under(real, b / own) for b in bases)

    def _scope_error(self, raw: str, tenant: str) -> BadRequest:
        if tenant == DEFAULT_TENANT:
            return BadRequest(f"`path` {raw!r} is outside the directories agents may be deployed from "
                              "(SERVICE_AGENT_ROOTS); upload the files instead")
        own = tenant_dir_name(tenant)
        return BadRequest(
            f"`path` {raw!r} is not allowed for this tenant: its agent folders must be under "
            f"`<agent root>/{own}/` (SERVICE_AGENT_ROOTS) or `<data dir>/{LIBRARY_DIR}/{own}/`, placed "
            "there by the operator; or upload the files instead"
        )

    def _forbidden_error(self, raw: str) -> BadRequest:
        return BadRequest(f"`path` {raw!r} is not allowed: an agent folder cannot be, contain or lead into "
                          f"/proc, /sys, /dev or the server's data directory (except its `{LIBRARY_DIR}/`)")

    def check(self, raw: str, tenant: str) -> Path:
        """Deploy time: the canonical path of the agent folder `raw` names (relative to the data
        dir), or BadRequest. Runs blocking filesystem calls: call it in a thread."""
        if "\x00" in raw or not raw.strip():
            raise BadRequest("`path` must be a directory path")
        named = Path(os.path.normpath(self.data_dir / Path(raw).expanduser()))
        if any(_under(named, p) for p in SYSTEM_PREFIXES):
            raise self._forbidden_error(raw)  # refused before anything there is even looked at
        try:
            real = named.resolve()
        except (OSError, RuntimeError):  # unreadable on the way, a loop: say no more than for a miss
            if tenant != DEFAULT_TENANT:
                raise self._scope_error(raw, tenant) from None
            raise BadRequest(f"`path` {raw!r} is not a readable directory on the server") from None
        if self._forbidden(real):
            raise self._forbidden_error(raw)
        if not self._in_scope(real, tenant):
            raise self._scope_error(raw, tenant)
        try:
            fd = open_dir(real)
        except OSError:
            raise BadRequest(f"`path` {raw!r} is not a readable directory on the server") from None
        try:
            if not _has_prompt(fd):
                raise BadRequest(f"directory {raw!r} lacks {SYSTEM_PROMPT_FILE}")
        finally:
            os.close(fd)
        return real

    def recheck(self, stored: str, tenant: str, name: str) -> Path:
        """Use time: the stored canonical path still passes the policy (settings may have changed
        since the deploy). BadRequest naming the agent otherwise."""
        real = Path(stored)
        if not real.is_absolute() or self._forbidden(real) or not self._in_scope(real, tenant):
            raise BadRequest(f"Agent {name} was deployed from a folder this server no longer allows "
                             "(see SERVICE_AGENT_ROOTS); redeploy it from an allowed folder or by upload")
        return real


def _has_prompt(dir_fd: int) -> bool:
    """AGENT.md is a regular file or a symlink (never followed here: inside the sandbox it resolves
    against the sandbox's own files, and following it would tell a caller what exists on the host)."""
    try:
        st = os.stat(SYSTEM_PROMPT_FILE, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)


def open_dir(path: Path) -> int:
    """Open directory `path` (absolute) one component at a time, never following a symlink.

    Raises OSError (ELOOP for a symlink on the way, ENOTDIR, ENOENT, ...). The returned descriptor
    is the directory that sits at exactly that canonical path now, whatever was swapped since.
    """
    if not path.is_absolute():
        raise OSError(errno.EINVAL, "not an absolute path", str(path))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        for part in path.parts[1:]:
            if part in (".", ".."):
                raise OSError(errno.EINVAL, "not a canonical path", str(path))
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_path(fd: int) -> Path:
    """A path that always leads to the open directory `fd`, whatever happens to its name."""
    return Path(f"/proc/self/fd/{fd}")


class AgentFolderReader:
    """`FileSource` on a deployed agent's folder. Each call opens the folder without following
    links and reads through a path bound to that directory, so a folder renamed or swapped for a
    link meanwhile cannot redirect the reads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @contextmanager
    def _opened(self) -> Iterator[Path]:
        try:
            fd = open_dir(self.folder)
        except OSError as exc:
            raise NotFound("The agent's folder is no longer at the path it was deployed from; redeploy the "
                           "agent") from exc
        try:
            yield fd_path(fd)
        finally:
            os.close(fd)

    def list_files(self) -> list[FileEntry]:
        with self._opened() as root:
            return list_files(root)

    def open_file(self, rel: str) -> tuple[BinaryIO, int]:
        with self._opened() as root:
            return open_file(root, rel)

    def read_for_json(self, rel: str, limit: int = JSON_LIMIT) -> str:
        with self._opened() as root:
            return DirectoryReader(root).read_for_json(rel, limit)

    def close(self) -> None:
        """Nothing to let go: each call opens what it reads."""


def roots_warning(roots_set: bool, other_tenants: bool) -> str | None:
    """What an operator must hear when tenants share a server whose path deploys are unconfined."""
    if roots_set or not other_tenants:
        return None
    return ("SERVICE_AGENT_ROOTS is unset and tenants other than `default` exist: tenant `default` can "
            "register any host folder that has an AGENT.md (outside /proc, /sys, /dev and the data dir) "
            f"and read its files; other tenants can deploy by path only from `<data dir>/{LIBRARY_DIR}/"
            "<tenant>/`. Set SERVICE_AGENT_ROOTS to confine path deploys to chosen directories.")
