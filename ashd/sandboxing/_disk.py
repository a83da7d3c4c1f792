"""A sandbox's disk: a sparse ext4 image, attached to a loop device and mounted on the host.

The kernel enforces the quota: the filesystem is exactly as big as the quota, so writing past it
fails inside the sandbox with ENOSPC ("No space left on device") and the host never gives the
sandbox more than the image's size. Everything a sandbox can write lands in it (workspace, HOME,
/tmp, its sockets and its log), so nothing a tenant runs can fill the data dir's filesystem.

The mount lives in the host's mount namespace and outlives a server killed with SIGKILL, so the
start-up rescue reads a leftover workspace as it was; an image that is no longer mounted (a
reboot, a server in a private mount namespace) is mounted again by `mount_image`, which replays
the journal. The loop device is set to auto-clear: it detaches itself once the filesystem is
unmounted (lazily, by `unmount`) and no longer used, so nothing leaks.

Costs measured here (scripts/bench_disk.py): a new image about 0.5 ms (a copy of a template made
once by mkfs.ext4, which itself takes 4 to 25 ms), loop attach + mount about 1 ms, lazy unmount
under 1 ms, on a quiet host.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ashd.errors import CapacityError, SandboxError

MIB = 1024 * 1024
# 4 MiB is ext4's smallest journal: it lets a mount after a host crash replay instead of guessing.
JOURNAL_MB = 4
MIN_DISK_MB = 32
# A filesystem with less than this free (or no free inode) is reported as full: ext4 refuses
# writes somewhat before its last block (delayed-allocation reservations).
FULL_MARGIN_BYTES = 2 * MIB
FULL_MARGIN_RATIO = 0.002

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A  # Linux 5.8+: attach and set flags in one ioctl
_LO_FLAGS_AUTOCLEAR = 4
_LO_FLAGS_DIRECT_IO = 16  # no second copy of the data in the host's page cache
_MS_NOSUID = 2
_MS_NODEV = 4
_MNT_DETACH = 2
_SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"

_libc = ctypes.CDLL(None, use_errno=True)


def mkfs_path() -> str | None:
    return shutil.which("mkfs.ext4", path=_SBIN_PATH + ":" + os.environ.get("PATH", ""))


def disk_quota_problems() -> list[str]:
    """Why this host cannot give sandboxes a disk quota (loop-mounted ext4 images); empty if it can."""
    problems: list[str] = []
    if not os.path.exists("/dev/loop-control"):
        problems.append("no loop devices (/dev/loop-control is missing: modprobe loop, or give the "
                        "container access to loop devices)")
    if mkfs_path() is None:
        problems.append("mkfs.ext4 not found (apt-get install e2fsprogs)")
    try:
        if "ext4" not in Path("/proc/filesystems").read_text().split():
            problems.append("the kernel has no ext4 filesystem (modprobe ext4)")
    except OSError:
        problems.append("cannot read /proc/filesystems")
    if os.geteuid() != 0:
        problems.append("the server is not root, so it cannot attach loop devices or mount")
    return problems


def create_image(image: Path, size_bytes: int, *, preallocate: bool, template: Path | None = None) -> None:
    """A new ext4 image of exactly `size_bytes`: sparse, or fully allocated when `preallocate`.
    With a `template` of that size (see `ImageMaker`), a copy of it instead of a new mkfs."""
    if template is not None:
        _copy_sparse(template, image, size_bytes)
    else:
        _mkfs(image, size_bytes)
    if preallocate:
        # After mkfs, which punches holes where it "zeroes": every block is then really reserved.
        fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as exc:
            image.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CapacityError(
                    f"not enough free space on the data dir for a sandbox disk of {size_bytes // MIB} MiB "
                    "(SERVICE_SANDBOX_DISK_PREALLOCATE reserves it whole); free space, or lower "
                    "SERVICE_SANDBOX_DISK_MB") from exc
            raise
        finally:
            os.close(fd)


def _mkfs(image: Path, size_bytes: int) -> None:
    fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size_bytes)
    finally:
        os.close(fd)
    mkfs = mkfs_path() or "mkfs.ext4"
    # 4 KiB blocks and one inode per 8 KiB (agents make many small files) whatever the size, no
    # blocks reserved for root (nothing inside runs as root), nothing zeroed or discarded up front.
    argv = [mkfs, "-q", "-F", "-b", "4096", "-i", "8192", "-I", "256", "-m", "0",
            "-J", f"size={JOURNAL_MB}", "-L", "ashd-sandbox",
            "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", str(image)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False,
                            env={"PATH": _SBIN_PATH, "LANG": "C"})
    if result.returncode != 0:
        image.unlink(missing_ok=True)
        raise SandboxError(f"could not make the sandbox's filesystem: mkfs.ext4 exited {result.returncode}: "
                           f"{result.stderr.strip()[-400:]}")


def _copy_sparse(src: Path, dst: Path, size_bytes: int) -> None:
    """Copy only the data extents of `src` (an empty filesystem's few hundred KiB), keeping holes."""
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fout, size_bytes)
            offset = 0
            while offset < size_bytes:
                try:
                    start = os.lseek(fin, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data after offset
                        break
                    raise
                end = os.lseek(fin, start, os.SEEK_HOLE)
                while start < end:
                    copied = os.copy_file_range(fin, fout, end - start, start, start)
                    if copied == 0:
                        break
                    start += copied
                offset = end
        except BaseException:
            os.close(fout)
            dst.unlink(missing_ok=True)
            raise
        os.close(fout)
    finally:
        os.close(fin)


class ImageMaker:
    """Makes sandbox disk images. The default size, which every pre-warmed sandbox has, is copied
    from a template made once per server (`<dir>/ext4-v1-<bytes>.img`): mkfs.ext4 is an exec of
    4 ms on a quiet host and 25 ms on a busy one, the copy well under 1 ms. Other sizes (a session
    asking for its own) get their own mkfs; they would otherwise leave a template per size."""

    VERSION = 1  # bump when the mkfs options change: older templates are then removed at start

    def __init__(self, directory: Path, default_size: int, *, preallocate: bool) -> None:
        self.directory = directory
        self.default_size = default_size
        self.preallocate = preallocate
        self._lock = threading.Lock()

    @property
    def template(self) -> Path:
        return self.directory / f"ext4-v{self.VERSION}-{self.default_size}.img"

    def start(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for old in self.directory.iterdir():
            if old != self.template:
                old.unlink(missing_ok=True)

    def make(self, image: Path, size_bytes: int) -> None:
        template = self._template() if size_bytes == self.default_size else None
        create_image(image, size_bytes, preallocate=self.preallocate, template=template)

    def _template(self) -> Path:
        with self._lock:
            if not self.template.exists():
                staging = self.template.with_suffix(f".{os.getpid()}.tmp")
                staging.unlink(missing_ok=True)
                _mkfs(staging, self.default_size)
                staging.replace(self.template)  # whole or absent, even after a crash
            return self.template


def _attach(image: Path) -> tuple[str, int]:
    """Attach `image` to a free loop device (auto-clear, direct I/O when the host allows it).
    Returns the device path and an open fd on it: keep it open until mounted, or it detaches."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(64):  # another process may take the free device between our two calls
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            device = f"/dev/loop{number}"
            fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            for flags in (_LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO, _LO_FLAGS_AUTOCLEAR):
                try:
                    fcntl.ioctl(fd, _LOOP_CONFIGURE, _loop_config(backing, flags, image))
                    return device, fd
                except OSError as exc:
                    if exc.errno == errno.EINVAL and flags & _LO_FLAGS_DIRECT_IO:
                        continue  # the data dir's filesystem has no direct I/O: buffered it is
                    if exc.errno != errno.EBUSY:
                        os.close(fd)
                        raise SandboxError(f"could not attach the sandbox disk to {device}: {exc}") from exc
                    break
            os.close(fd)
        raise SandboxError("could not find a free loop device for the sandbox disk")
    finally:
        os.close(backing)
        os.close(ctl)


def _loop_config(backing_fd: int, flags: int, image: Path) -> bytes:
    # struct loop_config { u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]; }
    info = struct.pack("=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, flags,
                       os.fsencode(image)[-63:], b"", b"", 0, 0)
    return struct.pack("=II", backing_fd, 0) + info + bytes(64)


def _mount(source: str, target: Path, options: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), b"ext4", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV),
                   options.encode()) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"could not mount the sandbox disk on {target}: {os.strerror(err)}")


def mount_options(*, discard: bool) -> str:
    # noinit_itable: the kernel would otherwise zero every inode table in the background, filling a
    # sparse image with zeros nobody needs.
    return "noinit_itable" + (",discard" if discard else "")


def mount_image(image: Path, target: Path, *, discard: bool) -> None:
    """Mount the image on `target` (nosuid, nodev). `discard` hands deleted blocks back to the host
    (the sparse image shrinks); never with a preallocated image, whose space stays reserved."""
    device, fd = _attach(image)
    try:
        _mount(device, target, mount_options(discard=discard))
    finally:
        os.close(fd)  # from here on the mount holds the device; unmounting frees it (auto-clear)


def loop_devices_of(image: Path) -> list[str]:
    """The loop devices `image` is attached to, from the kernel's own list in /sys. A lazily
    unmounted filesystem keeps its device (auto-clear) until its last user lets go."""
    target = str(image.resolve())
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().removesuffix(" (deleted)") == target:
                found.append(f"/dev/{backing.parent.parent.name}")
    return sorted(found)


def mount_leftover_image(image: Path, target: Path, *, discard: bool, wait_seconds: float) -> None:
    """Mount an image a previous server left unmounted, once no loop device holds it any more.

    An image still attached is a filesystem still being torn down (a lazy unmount whose last user,
    a dying sandbox, has not let go): a second instance mounted beside it would not see the first
    one's unwritten changes and could corrupt both. SandboxError when it stays attached for
    `wait_seconds` or the mount fails: the caller keeps the image for a later try."""
    deadline = time.monotonic() + wait_seconds
    while devices := loop_devices_of(image):
        if time.monotonic() >= deadline:
            raise SandboxError(f"the sandbox disk {image} is still attached to {', '.join(devices)} "
                               f"after {wait_seconds:g} s; it is kept for the next start")
        time.sleep(0.05)
    mount_image(image, target, discard=discard)


def is_mounted(target: Path | str) -> bool:
    """Whether a filesystem is mounted on `target`: `os.path.ismount`'s answer without its
    `realpath` of the parent, a `stat` of every folder on the way (seven for a sandbox's disk).
    Asked two or three times per sandbox start and by the disk meter; `target` is never a symlink
    that must be followed (a symlink is not a mount point, as for `ismount`), so its parent is the
    folder that holds it, and `stat` follows any link on the way as `realpath` would."""
    path = os.fspath(target)
    try:
        own = os.lstat(path)
    except (OSError, ValueError):
        return False
    if stat.S_ISLNK(own.st_mode):
        return False
    try:
        parent = os.stat(os.path.dirname(os.path.normpath(path)) or ".")
    except (OSError, ValueError):
        return False
    return own.st_dev != parent.st_dev or own.st_ino == parent.st_ino


def mounted_device(target: Path) -> tuple[str, int] | None:
    """The block device mounted on `target` (its /dev path and number), or None when nothing is.
    Read from the kernel's own tables (/sys/dev/block), not from a name kept since the mount."""
    if not is_mounted(target):
        return None
    dev = os.stat(target).st_dev
    try:
        name = os.path.basename(os.readlink(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    except OSError:
        return None  # not a block device's filesystem
    return f"/dev/{name}", dev


def unmount(target: Path) -> None:
    """Detach the filesystem from `target` now; the kernel finishes once nothing uses it."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise SandboxError(f"could not unmount the sandbox disk at {target}: {os.strerror(err)}")


@dataclass(frozen=True)
class DiskUsage:
    total_bytes: int
    free_bytes: int
    free_inodes: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.free_bytes

    @property
    def full(self) -> bool:
        margin = max(FULL_MARGIN_BYTES, int(self.total_bytes * FULL_MARGIN_RATIO))
        return self.free_bytes < margin or self.free_inodes == 0


def disk_usage(target: Path) -> DiskUsage | None:
    try:
        st = os.statvfs(target)
    except OSError:
        return None
    return DiskUsage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, st.f_favail)
