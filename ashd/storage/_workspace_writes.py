"""Files an API client writes into a live workspace (POST /api/sessions/{id}/files).

The workspace belongs to the sandbox, which may have put links anywhere in it, and the server
writes as root: so every directory is opened through its parent's descriptor with O_NOFOLLOW, an
existing file is unlinked rather than written through, and what is created belongs to the sandbox
user, as if the agent had written it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ashd.errors import BadRequest, DiskQuotaExceeded
from ashd.storage._agents import AgentFile
from ashd.storage._files import check_relative_path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _chown(fd: int, owner: tuple[int, int] | None) -> None:
    if owner is not None and os.geteuid() == 0:
        os.fchown(fd, owner[0], owner[1])


def _open_dir(parent_fd: int, name: str, owner: tuple[int, int] | None, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        _chown(fd, owner)
        return fd
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
        raise BadRequest(f"{shown!r} is a link or a file in the workspace, not a directory") from exc


def _write_one(root_fd: int, parts: list[str], data: bytes, owner: tuple[int, int] | None) -> None:
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts[:-1]):
            nfd = _open_dir(fd, name, owner, "/".join(parts[: i + 1]))
            os.close(fd)
            fd = nfd
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                raise BadRequest(f"{'/'.join(parts)!r} is a directory in the workspace")
            os.unlink(name, dir_fd=fd)
        out = os.open(name, _FILE_FLAGS, 0o644, dir_fd=fd)
        try:
            _chown(out, owner)
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        finally:
            os.close(out)
    finally:
        os.close(fd)


def write_files(workspace: Path, target: str, files: Sequence[AgentFile],
                owner: tuple[int, int] | None) -> list[str]:
    """Write `files` below `target` (a workspace-relative directory, "." for the top); returns the
    workspace-relative paths written. A full workspace disk raises DiskQuotaExceeded (files already
    written stay)."""
    base = [] if target.strip() in ("", ".", "./") else check_relative_path(target).split("/")
    rels = [check_relative_path(f.path) for f in files]  # every path is checked before any write
    written: list[str] = []
    root_fd = os.open(os.path.realpath(workspace), _DIR_FLAGS)
    try:
        for rel, f in zip(rels, files, strict=True):
            parts = base + rel.split("/")
            try:
                _write_one(root_fd, parts, f.data, owner)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskQuotaExceeded(
                        f"the session's workspace disk is full after {len(written)} of {len(files)} files "
                        f"({'/'.join(parts)!r} did not fit); remove files or create the session with a larger "
                        "`diskMb`") from exc
                raise
            written.append("/".join(parts))
    finally:
        os.close(root_fd)
    return written
