"""Files an API client writes into a live workspace (POST /api/sessions/{id}/files).

The workspace belongs to the sandbox, which may have put links anywhere in it, and the server
writes as root: so every directory is opened through its parent's descriptor with O_NOFOLLOW, an
existing file is unlinked rather than written through, and what is created belongs to the sandbox
user, as if the agent had written it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from ashd.errors import BadRequest, DiskQuotaExceeded
from ashd.storage import _untar
from ashd.storage._agents import AgentFile
from ashd.storage._files import check_relative_path

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_one(root_fd: int, parts: list[str], data: bytes, owner: tuple[int, int] | None) -> None:
    try:
        fd = _untar.walk_dirs(root_fd, parts[:-1], create=True, owner=owner)
    except _untar.Refused as exc:
        raise BadRequest(f"{'/'.join(parts[:-1])!r}: {exc}") from exc
    try:
        name = parts[-1]
        try:
            _untar.clear(fd, name)
        except IsADirectoryError as exc:
            raise BadRequest(f"{'/'.join(parts)!r} is a directory in the workspace") from exc
        out = os.open(name, _FILE_FLAGS, 0o644, dir_fd=fd)
        try:
            _untar.own(out, owner)
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
    root_fd = os.open(os.path.realpath(workspace), _untar.DIR_FLAGS)
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
