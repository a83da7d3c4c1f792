"""Workspace snapshots: a gzip tar per snapshot, written atomically, restored safely.

Layout: `<snapshots root>/<session id>/<key>`, where the key is `<created ns, 20 digits>-<file
count>.tar.gz`. Keys sort by creation time, so the newest is the largest name; the file count
rides in the name so listing snapshots never opens one.

A snapshot is written as `.partial-*` in the same directory, fsynced, then renamed into place and
the directory fsynced: a crash leaves either the previous snapshot or the new one, and a partial
file never matches the key pattern, so it is never taken as the latest.

gzip level 1: workspaces are mostly source text, which level 1 already shrinks well, and the
standard library has it (zstd would need a compiled dependency for little gain here).

Bounds: a snapshot archives at most `max_bytes` of file content (`SERVICE_SNAPSHOT_MAX_MB`). The
check is made before each file is read, so a bigger workspace (or a huge sparse file) costs neither
the disk nor the time to compress it: the snapshot is refused with SnapshotTooLarge (413), the
partial file removed, the previous snapshot kept. A full disk mid-write is the same story with
StorageFull (507). Either way the newest complete snapshot is still the newest one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import io
import logging
import os
import re
import stat
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ashd.errors import BadRequest, NotFound, PayloadTooLarge, StorageError, StorageFull
from ashd.storage import _untar
from ashd.storage._failures import is_no_space
from ashd.storage._files import MAX_ENTRIES, is_excluded, open_inside, symlink_target, walk

log = logging.getLogger(__name__)

KEY_RE = re.compile(r"^(\d{20})-(\d+)\.tar\.gz$")
PARTIAL_PREFIX = ".partial-"
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
DEFAULT_KEEP = 3
STALE_PARTIAL_SECONDS = 3600.0


class SnapshotTooLarge(PayloadTooLarge):
    """The workspace holds more file bytes than a snapshot may store."""


class _Budget:
    def __init__(self, session_id: str, limit: int | None) -> None:
        self.session_id = session_id
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> None:
        self.used += size
        if self.limit is not None and self.used > self.limit:
            raise SnapshotTooLarge(
                f"The workspace of session {self.session_id} holds more than {self.limit // (1024 * 1024)} MiB "
                "of files, the most a snapshot stores (SERVICE_SNAPSHOT_MAX_MB). No snapshot was taken and "
                "the previous one, if any, is kept; remove files from the workspace and try again")


def check_fits(workspace: Path, session_id: str, max_bytes: int | None, *, max_entries: int | None = None) -> bool:
    """SnapshotTooLarge when the files a snapshot of `workspace` would hold exceed `max_bytes`: a walk
    of the same entries, with no tar. For an answer that must say it before the snapshot is taken
    (a DELETE, whose snapshot follows it); the snapshot itself still counts as it archives. With
    `max_entries`, False when the tree has more entries than that (not checked: a walk that may take
    long belongs on a thread that may wait); True when it was checked."""
    if max_bytes is None:
        return True
    budget = _Budget(session_id, max_bytes)
    seen = 0
    for _rel, entry in walk(workspace, MAX_ENTRIES if max_entries is None else max_entries + 1):
        seen += 1
        if max_entries is not None and seen > max_entries:
            return False
        try:
            if entry.is_file(follow_symlinks=False):
                budget.take(entry.stat(follow_symlinks=False).st_size)
        except FileNotFoundError:
            continue  # removed while we walked a live workspace
    return True


class SnapshotBoard:
    """Count and bytes of every session's local snapshots. The snapshot actor writes it after each
    change; anyone reads it (what a tenant holds) without waiting behind that actor's tar work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, tuple[int, int]] = {}

    def refresh(self, session_id: str, session_dir: Path) -> None:
        count = size = 0
        for key in list_keys(session_dir):
            with contextlib.suppress(FileNotFoundError):
                size += (session_dir / key).stat().st_size
                count += 1
        with self._lock:
            if count:
                self._by_session[session_id] = (count, size)
            else:
                self._by_session.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._by_session.pop(session_id, None)

    def sessions(self) -> int:
        """How many sessions have snapshots at all."""
        with self._lock:
            return len(self._by_session)

    def totals(self, session_ids: list[str]) -> tuple[int, int]:
        """(snapshots, bytes) of these sessions."""
        with self._lock:
            found = [self._by_session.get(sid, (0, 0)) for sid in session_ids]
        return sum(c for c, _ in found), sum(b for _, b in found)


@dataclass(frozen=True)
class SnapshotInfo:
    session_id: str
    key: str
    path: Path
    size: int
    created_at: dt.datetime
    file_count: int


def check_session_id(session_id: str) -> str:
    """A session id is used as a directory and object-key component: refuse anything else."""
    if not SESSION_ID_RE.match(session_id) or session_id in {".", ".."}:
        raise BadRequest(f"invalid session id for a snapshot: {session_id!r}")
    return session_id


def make_key(created_ns: int, file_count: int) -> str:
    return f"{created_ns:020d}-{file_count}.tar.gz"


def parse_key(key: str) -> tuple[int, int] | None:
    """`(created ns, file count)` of a snapshot key, or None for anything else (partials too)."""
    m = KEY_RE.match(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def newest_key(keys: list[str]) -> str | None:
    valid = sorted(k for k in keys if parse_key(k) is not None)
    return valid[-1] if valid else None


def keys_to_prune(keys: list[str], keep: int) -> list[str]:
    valid = sorted(k for k in keys if parse_key(k) is not None)
    return valid[: max(0, len(valid) - keep)]


def info_for(session_id: str, path: Path) -> SnapshotInfo:
    parsed = parse_key(path.name)
    if parsed is None:
        raise StorageError(f"not a snapshot file name: {path.name}")
    created_ns, file_count = parsed
    created = dt.datetime.fromtimestamp(created_ns / 1e9, dt.UTC)
    return SnapshotInfo(session_id, path.name, path, path.stat().st_size, created, file_count)


def list_keys(session_dir: Path) -> list[str]:
    try:
        names = os.listdir(session_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if parse_key(n) is not None)


def latest_local(session_dir: Path, session_id: str) -> SnapshotInfo | None:
    """The newest complete snapshot in `session_dir`, or None."""
    # A key can vanish between listing and stat when another writer prunes; try the next one.
    for key in reversed(list_keys(session_dir)):
        with contextlib.suppress(FileNotFoundError):
            return info_for(session_id, session_dir / key)
    return None


def prune(session_dir: Path, keep: int) -> None:
    for key in keys_to_prune(list_keys(session_dir), keep):
        with contextlib.suppress(FileNotFoundError):
            (session_dir / key).unlink()


def remove_stale_partials(session_dir: Path, older_than: float = STALE_PARTIAL_SECONDS) -> None:
    """Remove leftovers of writers that crashed. Only old ones: another writer sharing the
    directory (a shared `file://` mount) may be writing a fresh one right now."""
    now = time.time()
    try:
        entries = list(os.scandir(session_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(PARTIAL_PREFIX):
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime >= older_than:
                    os.unlink(entry.path)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def next_created_ns(session_dir: Path) -> int:
    """Now, but strictly after the newest key present, so keys stay ordered and unique."""
    now = time.time_ns()
    newest = newest_key(list_keys(session_dir))
    parsed = parse_key(newest) if newest else None
    return max(now, parsed[0] + 1) if parsed else now


def write_atomically(directory: Path, write: Callable[[BinaryIO], None], name: Callable[[], str]) -> Path:
    """Write a file in `directory` through a partial file: `write` fills it, it is fsynced, then
    renamed to `name()` (asked only once the content is complete) and the directory fsynced."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=PARTIAL_PREFIX, suffix=".tar.gz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw:
            write(raw)
            raw.flush()
            os.fsync(raw.fileno())
        final = directory / name()
        os.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return final


class _Exact:
    """Exactly `size` bytes of a file that may change while it is archived: a tar member's length
    is fixed in its header, so a shrinking file is padded with zeros and a growing one cut."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self._fh = fh
        self._left = size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._fh.read(n)
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self._left -= n
        return data


def _add_tree(tf: tarfile.TarFile, workspace: Path, on_progress: Callable[[int], None] | None,
              budget: _Budget) -> int:
    real_root = workspace.resolve()
    count = 0
    for rel, entry in walk(workspace, MAX_ENTRIES):
        info = tarfile.TarInfo(rel)
        try:
            if entry.is_symlink():
                target = symlink_target(real_root, real_root / rel)
                if target is None:
                    continue  # leaves the workspace, dangles, or leads into an excluded path
                info.type = tarfile.SYMTYPE
                # Relative, so the link also holds wherever the snapshot is restored.
                info.linkname = os.path.relpath(target, (real_root / rel).parent)
                info.mtime = int(entry.stat(follow_symlinks=False).st_mtime)
                info.mode = 0o777
                tf.addfile(info)
                count += 1 if target.is_file() else 0
            elif entry.is_dir(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                info.type = tarfile.DIRTYPE
                info.mode = stat.S_IMODE(st.st_mode)
                info.mtime = int(st.st_mtime)
                tf.addfile(info)
            else:
                count += _add_file(tf, info, real_root, real_root / rel, budget)
        except FileNotFoundError:
            continue  # removed while we walked a live workspace
        if on_progress is not None:
            on_progress(count)
    return count


def _add_file(tf: tarfile.TarFile, info: tarfile.TarInfo, real_root: Path, path: Path, budget: _Budget) -> int:
    # The entry was a regular file inside the workspace when listed; whatever replaced it since (a
    # link, a FIFO, a parent directory swapped for a link to a host path) is refused on the descriptor.
    fd = open_inside(real_root, path)
    if fd is None:
        return 0
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        budget.take(st.st_size)  # before reading: a file over the budget is never compressed
        info.size = st.st_size
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        tf.addfile(info, _Exact(fh, st.st_size))  # type: ignore[arg-type]
    return 1


def bundle_workspace(workspace: Path, out: BinaryIO, budget: _Budget, *, compresslevel: int = 1,
                     on_progress: Callable[[int], None] | None = None) -> int:
    """Write `workspace` as a tar.gz to `out` (a snapshot's format); returns the files written.
    SnapshotTooLarge once the files pass the budget."""
    # mtime=0: the gzip header carries no clock, so identical trees give identical bytes.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=compresslevel, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf,
    ):
        return _add_tree(tf, workspace, on_progress, budget)


def bundle_budget(session_id: str, max_bytes: int | None) -> _Budget:
    return _Budget(session_id, max_bytes)


def snapshot_workspace(
    workspace: Path,
    dest_dir: Path,
    session_id: str,
    *,
    keep: int = DEFAULT_KEEP,
    compresslevel: int = 1,
    on_progress: Callable[[int], None] | None = None,
    max_bytes: int | None = None,
) -> SnapshotInfo:
    """Archive `workspace` into a new snapshot in `dest_dir` (the session's directory) and keep the
    newest `keep` snapshots there. `on_progress(files so far)` is called after each entry.
    SnapshotTooLarge past `max_bytes` of file content, StorageFull when the disk fills; both leave
    the directory as it was."""
    check_session_id(session_id)
    if not workspace.is_dir():
        raise NotFound(f"workspace of session {session_id} does not exist: {workspace}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(dest_dir)
    count = 0
    budget = _Budget(session_id, max_bytes)

    def write(raw: BinaryIO) -> None:
        nonlocal count
        count = bundle_workspace(workspace, raw, budget, compresslevel=compresslevel, on_progress=on_progress)

    started = time.monotonic()
    try:
        final = write_atomically(dest_dir, write, lambda: make_key(next_created_ns(dest_dir), count))
    except OSError as exc:
        if is_no_space(exc):
            raise StorageFull(
                f"The server's data disk is full: the snapshot of session {session_id} could not be written. "
                "The previous snapshot is kept and nothing stored was lost; retry once space is freed") from exc
        raise
    prune(dest_dir, keep)
    info = info_for(session_id, final)
    log.info(
        "snapshot written",
        extra={"session_id": session_id, "key": info.key, "bytes": info.size, "files": count,
               "seconds": round(time.monotonic() - started, 3)},
    )
    return info


def restore_bundle(data: bytes, dest: Path, owner: tuple[int, int] | None) -> _untar.Outcome:
    """Extract a client's tar(.gz) bundle into a live workspace under the snapshot rules, every
    entry created for `owner`. BadRequest for a damaged or non-tar bundle."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            return _untar.extract(tf, dest, keep=lambda rel: not is_excluded(rel), owner=owner)
    except (tarfile.ReadError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BadRequest(f"`bundle` is not a readable tar or tar.gz archive: {exc}") from exc


def restore_workspace(snapshot: SnapshotInfo | Path, dest: Path) -> int:
    """Extract a snapshot into `dest` (created if needed; existing files with the same names are
    replaced). Returns the number of files and links restored.

    Extraction follows the rules of tarfile's `data` filter, applied by ashd itself on every Python
    it admits (`_untar`): no absolute paths, no `..`, no links leading outside `dest`, no device
    files or FIFOs, no setuid bits, no ownership changes, and no write ever goes through a link. A
    member the rules refuse, or in an excluded path, is skipped with a WARNING; the rest is restored.
    """
    path = snapshot.path if isinstance(snapshot, SnapshotInfo) else snapshot
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(path, "r:*") as tf:
            outcome = _untar.extract(tf, dest, keep=lambda rel: not is_excluded(rel))
    except (tarfile.ReadError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise StorageError(f"snapshot {path.name} is damaged and cannot be restored: {exc}") from exc
    if outcome.skipped:
        log.warning("snapshot restore skipped unsafe or conflicting entries",
                    extra={"snapshot": str(path), "skipped": outcome.skipped[:20], "count": len(outcome.skipped)})
    return len(outcome.restored)
