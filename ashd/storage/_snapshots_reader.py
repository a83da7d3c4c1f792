"""Reading files out of a snapshot tar without extracting it, under the same rules as a workspace.

The reader holds the snapshot open, so pruning it meanwhile does not break a request in flight.
It indexes the members on first use (one pass over the archive) and then reads each file through
its own handle (`/proc/self/fd/N` opens a new file description, with its own offset), so one reader
can serve several executor threads at once. Members are looked up by name and never extracted.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import os
import posixpath
import tarfile
import threading
import weakref
import zlib
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from ashd.errors import BadRequest, NotFound, StorageError
from ashd.storage._files import (
    JSON_LIMIT,
    MAX_ENTRIES,
    FileEntry,
    check_json_size,
    check_relative_path,
    decode_text,
    is_excluded,
)

MAX_LINK_HOPS = 40


class _MemberReader(io.RawIOBase):
    """The `size` bytes of one member, from a stream already positioned at its data."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self._stream = stream
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._left <= 0:
            return 0
        view = memoryview(buffer)
        data = self._stream.read(min(len(view), self._left))
        if not data:
            raise StorageError("snapshot ended before the file did; the snapshot is damaged")
        view[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


class _Closing(io.BufferedIOBase):
    """A GzipFile that also closes the file it reads from (GzipFile leaves a passed file open)."""

    def __init__(self, gz: gzip.GzipFile, raw: BinaryIO) -> None:
        self._gz = gz
        self._raw = raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        return self._gz.read(-1 if n is None else n)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._gz.seek(offset, whence)

    def tell(self) -> int:
        return self._gz.tell()

    def close(self) -> None:
        if not self.closed:
            self._gz.close()
            self._raw.close()
        super().close()


def _normalise(name: str) -> str | None:
    """A member name as a workspace path, or None when it is absolute or climbs out."""
    name = name.rstrip("/")
    while name.startswith("./"):
        name = name[2:]
    if not name or name.startswith("/") or "\x00" in name:
        return None
    if ".." in name.split("/"):
        return None
    return name


def _link_target(member_dir: str, linkname: str) -> str | None:
    if linkname.startswith("/"):
        return None
    target = posixpath.normpath(posixpath.join(member_dir, linkname))
    if target in (".", "") or target == ".." or target.startswith("../"):
        return None
    return target


class SnapshotReader:
    """`list_files()`, `open_file(rel)` and `read_for_json(rel)` on a snapshot tar.

    Same rules as `_files`: exclusions, no traversal, symlinks only within the snapshot, limits.
    Close it (or use `with`) to release the open snapshot; a forgotten reader closes when collected.
    """

    def __init__(self, path: Path, max_entries: int = MAX_ENTRIES) -> None:
        self.path = path
        self._max_entries = max_entries
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._close = weakref.finalize(self, os.close, self._fd)
        self._lock = threading.Lock()
        self._index: dict[str, tarfile.TarInfo] | None = None

    def close(self) -> None:
        self._close()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _data_stream(self) -> BinaryIO:
        """A new handle on the uncompressed tar bytes, with its own offset."""
        if not self._close.alive:
            raise StorageError("snapshot reader is closed")
        raw = open(f"/proc/self/fd/{self._fd}", "rb")  # noqa: SIM115 -- closed by the caller
        if raw.read(2) != b"\x1f\x8b":
            raw.seek(0)
            return raw
        raw.seek(0)
        return _Closing(gzip.GzipFile(fileobj=raw, mode="rb"), raw)  # type: ignore[return-value]

    def _members(self) -> dict[str, tarfile.TarInfo]:
        with self._lock:
            if self._index is None:
                index: dict[str, tarfile.TarInfo] = {}
                try:
                    with self._data_stream() as data, tarfile.open(fileobj=data, mode="r:") as tf:
                        for member in tf:
                            name = _normalise(member.name)
                            if name is not None:
                                index[name] = member
                            if len(index) >= self._max_entries:
                                break
                except (tarfile.ReadError, EOFError, zlib.error, OSError) as exc:
                    raise StorageError(f"snapshot {self.path.name} cannot be read: {exc}") from exc
                self._index = index
            return self._index

    def _lookup(self, rel: str, hops: int = 0) -> tarfile.TarInfo | None:
        """The member `rel` leads to, following symlinks (also on directories along the path)
        and hard links only within the snapshot; None when absent or leading outside."""
        if hops > MAX_LINK_HOPS:
            return None
        index = self._members()
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            member = index.get(prefix)
            if member is None:
                if i == len(parts):
                    return None
                continue  # a directory the archive has no entry for
            if member.issym():
                target = _link_target(posixpath.dirname(prefix), member.linkname)
            elif member.islnk():
                target = _normalise(member.linkname)
            elif i < len(parts) and not member.isdir():
                return None
            else:
                continue
            if target is None or is_excluded(target):
                return None
            return self._lookup("/".join([target, *parts[i:]]), hops + 1)
        return index.get(rel)

    def list_files(self) -> list[FileEntry]:
        """Every file in the snapshot, sorted, with exclusions; links to files are listed as files."""
        files: list[FileEntry] = []
        for name in self._members():
            if is_excluded(name):
                continue
            # Looked up like a client path, so a member below a link that leaves is not listed.
            target = self._lookup(name)
            if target is not None and target.isfile():
                files.append(FileEntry(name, target.size, dt.datetime.fromtimestamp(target.mtime, dt.UTC)))
        files.sort(key=lambda f: f.path)
        return files

    def stat(self, rel: str) -> tarfile.TarInfo:
        """The regular-file member behind `rel`; BadRequest/NotFound as `_files.resolve_file`."""
        cleaned = check_relative_path(rel)
        member = None if is_excluded(cleaned) else self._lookup(cleaned)
        if member is None:
            raise NotFound(f"file not found in the session's snapshot: {cleaned}")
        if member.isdir():
            raise BadRequest(f"{cleaned} is a directory; list files with GET .../files instead")
        if not member.isfile():
            raise BadRequest(f"{cleaned} is not a regular file and cannot be read")
        return member

    def open_file(self, rel: str) -> tuple[BinaryIO, int]:
        """An open stream of the file's bytes and its size. Close the stream when done."""
        member = self.stat(rel)
        stream = self._data_stream()
        try:
            stream.seek(member.offset_data)
        except BaseException:
            stream.close()
            raise
        return io.BufferedReader(_MemberReader(stream, member.size)), member.size  # type: ignore[arg-type]

    def read_for_json(self, rel: str, limit: int = JSON_LIMIT) -> str:
        """The file's UTF-8 text; BadRequest when larger than `limit` or binary."""
        member = self.stat(rel)
        check_json_size(member.size, limit)
        stream, _ = self.open_file(rel)
        with stream:
            data = stream.read()
        return decode_text(data)
