"""Reading a workspace's files for the HTTP layer: listing, safe path resolution, size limits, headers.

Pure, synchronous functions: the HTTP layer runs them in an executor. The same rules apply to a
live workspace (this module) and to a persisted snapshot (`_snapshots_reader.SnapshotReader`):

- the interface's exclusion list (directories `EXCLUDED_DIRS`, files ending in `EXCLUDED_SUFFIXES`);
- a path is relative, `/`-separated, with no `..` segment, no leading `/` and no NUL;
- a symlink is served only when it resolves to a regular file inside the workspace; anything
  reached through a symlink that leaves the workspace is treated as absent;
- sockets, FIFOs and device files are never listed nor opened.
"""

from __future__ import annotations

import datetime as dt
import mimetypes
import os
import stat
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from ashd.errors import BadRequest, NotFound
from ashd.storage._models import iso

EXCLUDED_DIRS = frozenset(
    {"node_modules", ".git", "__pycache__", ".cache", ".npm", ".pnpm-store", ".yarn", ".venv", "venv",
     ".tmp", "tmp"}
)
EXCLUDED_SUFFIXES = (".sock", ".lock", ".pid")

MAX_ENTRIES = 100_000
JSON_LIMIT = 1024 * 1024  # "1 MB" of the interface, read as MiB
RAW_LIMIT = 100 * 1024 * 1024  # "100 MB" of the interface, read as MiB


@dataclass(frozen=True)
class FileEntry:
    """One file of a workspace or snapshot; `path` is relative to the root, `/`-separated."""

    path: str
    size: int
    modified_at: dt.datetime

    def to_json(self) -> dict[str, object]:
        """The interface's FileEntry: `{path, size, modifiedAt}`."""
        return {"path": self.path, "size": self.size, "modifiedAt": iso(self.modified_at)}


def is_excluded(rel: str) -> bool:
    """True when a relative path lies in an excluded directory or names an excluded file type."""
    parts = rel.split("/")
    if any(part in EXCLUDED_DIRS for part in parts[:-1]):
        return True
    return parts[-1] in EXCLUDED_DIRS or parts[-1].endswith(EXCLUDED_SUFFIXES)


def check_relative_path(rel: str) -> str:
    """Validate a client-supplied file path; return it without a trailing `/`. Raises BadRequest."""
    if not rel:
        raise BadRequest("file path is required, e.g. /files/src/main.py")
    if "\x00" in rel:
        raise BadRequest("file path must not contain a NUL character")
    if rel.startswith("/"):
        raise BadRequest(f"file path must be relative to the workspace, not start with '/': {rel!r}")
    parts = rel.split("/")
    if ".." in parts:
        raise BadRequest(f"file path must not contain a '..' segment: {rel!r}")
    cleaned = "/".join(p for p in parts if p not in ("", "."))
    if not cleaned:
        raise BadRequest(f"file path {rel!r} names the workspace itself, not a file")
    return cleaned


def _utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def _inside(real_root: Path, target: Path) -> bool:
    return target == real_root or target.is_relative_to(real_root)


def symlink_target(real_root: Path, link: Path) -> Path | None:
    """Where an in-workspace symlink leads, or None when it dangles, loops, leaves the workspace,
    or leads into an excluded path. `real_root` must already be resolved."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not _inside(real_root, target) or target == real_root:
        return None
    if is_excluded(target.relative_to(real_root).as_posix()):
        return None
    return target


def walk(root: Path, max_entries: int = MAX_ENTRIES) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Yield `(rel, entry)` for every non-excluded directory, regular file and symlink under `root`,
    depth first, never descending into symlinked directories. Stops after `max_entries` entries.

    A live workspace changes under the walk (the sandbox may rename a directory and put a link to a
    host path in its place at any moment), and the server reads as root: so each directory is opened
    without following a final link, checked to be inside `root` once open, and listed through that
    descriptor. Entries are those of the opened directory; read them with `root / rel` and a check
    on the opened file (as `open_inside` does), never by trusting the path."""
    real_root = Path(os.path.realpath(root))
    count = 0
    stack: list[tuple[str, str]] = [("", str(real_root))]
    while stack:
        prefix, directory = stack.pop()
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # vanished, unreadable, or a link now
        try:
            if not _inside(real_root, Path(os.readlink(f"/proc/self/fd/{fd}"))):
                continue  # a parent was swapped for a link to outside since it was listed
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            subdirs: list[tuple[str, str]] = []
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                if is_excluded(rel):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append((f"{rel}/", f"{directory}/{entry.name}"))
                    elif not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                        continue  # socket, FIFO, device
                except OSError:
                    continue
                count += 1
                yield rel, entry  # entry.stat() reads through `fd`, open until the next directory
                if count >= max_entries:
                    return
            stack.extend(reversed(subdirs))
        except OSError:
            continue
        finally:
            os.close(fd)


def open_inside(real_root: Path, path: Path) -> int | None:
    """An O_RDONLY descriptor of the regular file at `path` if, once open, it really is inside
    `real_root` (no link on the way led out: checked on the descriptor, so no race can fool it);
    else None. Non-blocking open, so a FIFO swapped in cannot hang the reader; blocking after."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and _inside(real_root, Path(os.readlink(f"/proc/self/fd/{fd}"))):
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def list_files(root: Path, max_entries: int = MAX_ENTRIES) -> list[FileEntry]:
    """Every file under `root`, recursively, sorted by path, with the interface's exclusions.

    A symlink to a regular file inside the workspace is listed as a file (its target's size and
    time); other symlinks are skipped. At most `max_entries` entries are examined.
    """
    real_root = root.resolve()
    files: list[FileEntry] = []
    for rel, entry in walk(root, max_entries):
        try:
            if entry.is_symlink():
                target = symlink_target(real_root, real_root / rel)
                if target is None:
                    continue
                st = target.stat()
            else:
                st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append(FileEntry(rel, st.st_size, _utc(st.st_mtime)))
    files.sort(key=lambda f: f.path)
    return files


def resolve_file(root: Path, rel: str) -> Path:
    """The real path of a workspace file to serve.

    400 (BadRequest): the path is empty, has a `..` segment, starts with `/`, contains NUL, or names
    a directory or something that is not a regular file (socket, FIFO, device).
    404 (NotFound): nothing at that path, a dangling symlink, or a symlink (anywhere on the path)
    resolving outside the workspace. Escaping links are 404 rather than 400 because, seen from
    the workspace, there is no file there: the answer is the same whether or not the outside target
    exists, so it reveals nothing about the host filesystem.

    The returned path contains no symlinks; `open_file` additionally re-checks after opening,
    since a sandboxed process may swap a path component for a symlink at any moment.
    """
    cleaned = check_relative_path(rel)
    real_root = root.resolve()
    candidate = real_root / cleaned
    try:
        candidate.lstat()
        real = candidate.resolve(strict=True)
        mode = real.stat().st_mode  # may be gone already: the sandbox keeps changing its files
    except (OSError, RuntimeError) as exc:  # missing, dangling, a loop, a file used as a directory
        raise NotFound(f"file not found in the workspace: {cleaned}") from exc
    if not _inside(real_root, real):
        raise NotFound(f"file not found in the workspace: {cleaned} (a symlink that leads outside it)")
    if stat.S_ISDIR(mode):
        raise BadRequest(f"{cleaned} is a directory; list files with GET .../files instead")
    if not stat.S_ISREG(mode):
        raise BadRequest(f"{cleaned} is not a regular file (socket, FIFO or device) and cannot be read")
    return real


def open_file(root: Path, rel: str) -> tuple[BinaryIO, int]:
    """Open a workspace file for reading; return the open file and its size. Same errors as
    `resolve_file`. The final check runs on the open descriptor, so a symlink swapped in after the
    resolution cannot redirect the read outside the workspace."""
    real = resolve_file(root, rel)
    real_root = root.resolve()
    # O_NONBLOCK: a FIFO swapped in after the check must not hang the reading thread.
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # a component removed or swapped for a link since the resolution
        raise NotFound(f"file not found in the workspace: {rel} (it changed while being opened)") from exc
    try:
        st = os.fstat(fd)
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not stat.S_ISREG(st.st_mode) or not _inside(real_root, opened):
            raise NotFound(f"file not found in the workspace: {rel} (it changed while being opened)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def check_json_size(size: int, limit: int = JSON_LIMIT) -> None:
    if size > limit:
        raise BadRequest(
            f"file is {size} bytes; format=json is limited to {_human(limit)}, use format=raw"
        )


def check_raw_size(size: int, limit: int = RAW_LIMIT) -> None:
    """Raise BadRequest when a file is larger than a raw download may be."""
    if size > limit:
        raise BadRequest(f"file is {size} bytes; downloads are limited to {_human(limit)}")


def decode_text(data: bytes) -> str:
    """UTF-8 text of a file read for format=json, or BadRequest when it is not text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"file is binary (not valid UTF-8 at byte {exc.start}); format=json returns text only, "
            "use format=raw"
        ) from exc


def mime_type(filename: str) -> str:
    """Content-Type from the file extension; `application/octet-stream` when unknown."""
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    return guessed or "application/octet-stream"


def content_disposition(filename: str) -> str:
    """`attachment; filename*=UTF-8''<percent-encoded>` (RFC 6266/5987) and no other parameter, as the
    interface gives it (decisions.md); every current client reads `filename*`. Only the last path
    component is used."""
    name = filename.rsplit("/", 1)[-1] or "download"
    return f"attachment; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


def _human(limit: int) -> str:
    mib = 1024 * 1024
    return f"{limit // mib} MB" if limit % mib == 0 else f"{limit} bytes"


class FileSource(Protocol):
    """What the file endpoints need, from a live workspace (`DirectoryReader`) or a snapshot
    (`SnapshotReader`): the same calls, the same errors."""

    def list_files(self) -> list[FileEntry]: ...

    def open_file(self, rel: str) -> tuple[BinaryIO, int]: ...

    def read_for_json(self, rel: str, limit: int = JSON_LIMIT) -> str: ...

    def close(self) -> None: ...


class DirectoryReader:
    """`FileSource` on a live workspace directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list_files(self) -> list[FileEntry]:
        return list_files(self.root)

    def open_file(self, rel: str) -> tuple[BinaryIO, int]:
        return open_file(self.root, rel)

    def read_for_json(self, rel: str, limit: int = JSON_LIMIT) -> str:
        stream, size = open_file(self.root, rel)
        with stream:
            check_json_size(size, limit)
            data = stream.read(limit + 1)
        check_json_size(len(data), limit)
        return decode_text(data)

    def close(self) -> None:
        """Nothing to let go: each call opens what it reads."""
