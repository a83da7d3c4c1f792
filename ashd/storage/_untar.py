"""Extract a tar into a directory safely, the same way on every Python ashd admits.

`TarFile.extract(filter=...)` and `tarfile.data_filter` exist only from Python 3.11.4 (Debian 12
ships 3.11.2), and the filters of older patch releases have known bypasses (CVE-2025-4517 and its
siblings, fixed in 3.12.11/3.13.4). So ashd does not rely on the interpreter's filter: this module
applies the `data` filter's rules itself and writes every entry through directory file descriptors
opened with O_NOFOLLOW, so no write ever goes through a link, whatever the archive or the
destination already holds.

Refused, as by the `data` filter: `..` in a path (stricter: even when it would stay inside),
device files, FIFOs and other special files, links with an absolute target or a target outside the
destination (resolved against what is on disk, as the filter does), and hard links to outside.
Also refused: an entry whose parent directory is a link (the filter would follow it). Made safe: a
leading `/` is stripped, set-uid/set-gid/sticky and group/other write bits are dropped, files stay
readable and writable by their owner, ownership in the archive is ignored. An existing entry with
the same name as a file or link in the archive is replaced (unlinked first, never written through);
a directory where the archive has a file is left alone and the entry skipped. A full disk (ENOSPC,
EDQUOT) is raised, never skipped: a partial restore must not pass as a whole one.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024


class Refused(Exception):
    """An archive entry the rules do not allow; the message says why."""


@dataclass
class Outcome:
    restored: list[str] = field(default_factory=list)  # files and links written
    skipped: list[str] = field(default_factory=list)  # "'name': reason"


def _clean_parts(raw: str) -> list[str]:
    parts = [p for p in raw.lstrip("/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused("'..' in the path")
    return parts


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _file_mode(mode: int) -> int:
    """The `data` filter's rule: no high bits, no group/other write; owner rw; x only if owner x."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def check_member(member: tarfile.TarInfo, dest_real: str) -> list[str]:
    """The cleaned path components of `member`, or Refused. `dest_real`: realpath of the target."""
    parts = _clean_parts(member.name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise Refused("a special file (device, FIFO or similar)")
    if member.issym() or member.islnk():
        if not parts:
            raise Refused("a link without a name")
        if member.linkname.startswith("/"):
            raise Refused(f"a link to the absolute path {member.linkname!r}")
        base = parts[:-1] if member.issym() else []
        lexical = os.path.normpath(os.path.join(*base, member.linkname) if base else member.linkname)
        resolved = os.path.realpath(os.path.join(dest_real, *base, member.linkname))
        if lexical == ".." or lexical.startswith("../") or not _inside(resolved, dest_real):
            raise Refused(f"a link to {member.linkname!r}, outside the destination")
    return parts


Owner = tuple[int, int] | None  # (uid, gid) for what is created; None: the caller's own


def own(fd: int, owner: Owner) -> None:
    """Give what `fd` names to `owner`; only root can, and a server that is not root has no other
    user to give it to (weak isolation: the sandbox runs as the server's own user)."""
    if owner is not None and os.geteuid() == 0:
        os.fchown(fd, owner[0], owner[1])


def _open_dir(parent_fd: int, name: str, *, create: bool, owner: Owner = None) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        own(fd, owner)
        return fd
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
        raise Refused(f"{name!r} on the way is a link or a file, not a directory") from exc


def walk_dirs(root_fd: int, parts: list[str], *, create: bool, owner: Owner = None) -> int:
    """An fd of the directory `parts` names below root_fd, never following a link."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            nfd = _open_dir(fd, name, create=create, owner=owner)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def clear(dir_fd: int, name: str) -> None:
    """Make room for a new file or link: unlink what is there, unless it is a directory."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{name!r} is a directory here")
    os.unlink(name, dir_fd=dir_fd)


def _write_file(tf: tarfile.TarFile, member: tarfile.TarInfo, dir_fd: int, name: str, owner: Owner) -> None:
    clear(dir_fd, name)
    mode = _file_mode(member.mode)
    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    own(fd, owner)
    with os.fdopen(fd, "wb") as out:
        src = tf.extractfile(member)
        if src is not None:
            with src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
        out.flush()
        os.fchmod(fd, mode)
        os.utime(fd, (member.mtime, member.mtime))


def _write(tf: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, parts: list[str], owner: Owner) -> None:
    if member.isdir():
        os.close(walk_dirs(root_fd, parts, create=True, owner=owner))
        return
    dir_fd = walk_dirs(root_fd, parts[:-1], create=True, owner=owner)
    try:
        name = parts[-1]
        if member.isreg():
            _write_file(tf, member, dir_fd, name, owner)
        elif member.issym():
            clear(dir_fd, name)
            os.symlink(member.linkname, name, dir_fd=dir_fd)
            if owner is not None and os.geteuid() == 0:
                os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)
        else:  # hard link: to an entry already extracted, found without following links
            src_parts = _clean_parts(member.linkname)
            if not src_parts:
                raise Refused("a hard link without a target")
            src_fd = walk_dirs(root_fd, src_parts[:-1], create=False)
            try:
                clear(dir_fd, name)
                os.link(src_parts[-1], name, src_dir_fd=src_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            finally:
                os.close(src_fd)
    finally:
        os.close(dir_fd)


def extract(tf: tarfile.TarFile, dest: Path, keep: Callable[[str], bool], owner: Owner = None) -> Outcome:
    """Extract every member of `tf` into the existing directory `dest` under the rules above.
    `keep(path)` decides on paths the rules allow (False: skipped as excluded). `owner`: (uid, gid)
    given to every directory, file and link created (a live sandbox's user)."""
    outcome = Outcome()
    links: list[str] = []
    dest_real = os.path.realpath(dest)
    root_fd = os.open(dest_real, DIR_FLAGS)
    try:
        for member in tf:
            try:
                parts = check_member(member, dest_real)
                if not parts:
                    continue  # the archive's root directory entry
                rel = "/".join(parts)
                if not keep(rel):
                    outcome.skipped.append(f"{member.name!r}: excluded path")
                    continue
                _write(tf, member, root_fd, parts, owner)
                if not member.isdir():
                    outcome.restored.append(rel)
                if member.issym():
                    links.append(rel)
            except (Refused, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise  # the destination is full: a partial restore must not pass as whole
                outcome.skipped.append(f"{member.name!r}: {exc}")
        _drop_escaping_links(root_fd, dest_real, outcome, links)
    finally:
        os.close(root_fd)
    return outcome


def _drop_escaping_links(root_fd: int, dest_real: str, outcome: Outcome, links: list[str]) -> None:
    """A link checked when it was written can lead outside once a later link changes a directory
    on its way (`a -> b/c/../..`, then `b -> .`): check them all again at the end, until none does."""
    while True:
        bad = [r for r in links if not _inside(os.path.realpath(os.path.join(dest_real, r)), dest_real)]
        if not bad:
            return
        for rel in bad:
            links.remove(rel)
            outcome.restored.remove(rel)
            outcome.skipped.append(f"{rel!r}: a link that leads outside the destination")
            parts = rel.split("/")
            try:
                dir_fd = walk_dirs(root_fd, parts[:-1], create=False)
            except (Refused, OSError):
                continue
            try:
                if stat.S_ISLNK(os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.unlink(parts[-1], dir_fd=dir_fd)
            except OSError:
                pass
            finally:
                os.close(dir_fd)
