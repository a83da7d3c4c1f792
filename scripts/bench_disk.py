"""Sandbox disk benchmarks: what a disk quota costs (ashd/sandboxing/_disk.py).

    .venv/bin/python scripts/bench_disk.py [--n 40] [--size-mb 1024] [--write-mb 256]

Prints figures; asserts nothing. Needs root and loop devices. Parts:
1. One sandbox disk, step by step: make the image (a new mkfs.ext4, or a copy of the template the
   launcher makes once for the default size), attach + mount, lazy unmount, and the whole
   `SandboxLauncher.prepare` + `destroy_dirs` pair (directories included).
2. The same with SERVICE_SANDBOX_DISK_PREALLOCATE (fallocate after mkfs).
3. Writing through the loop mount against a plain directory of the data dir's filesystem
   (sequential 1 MiB writes + fsync, as root on the host side).
4. ResourceMeter.check() on a prepared sandbox (what each tool call's limits_check costs the
   server, before the socket round trip).
Everything is made under a temporary directory on the data dir's filesystem (/tmp here) and
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ashd.sandboxing import LauncherConfig, SandboxLauncher, SandboxLimits
from ashd.sandboxing._disk import MIB, ImageMaker, create_image, mount_image, unmount
from ashd.sandboxing._meter import ResourceMeter


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def line(label: str, values: list[float]) -> str:
    return (f"{label:46s} n={len(values):3d}  p50 {pct(values, 0.5):7.2f} ms  p99 {pct(values, 0.99):7.2f} ms"
            f"  mean {statistics.mean(values) * 1000:7.2f} ms")


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_steps(root: Path, n: int, size: int, preallocate: bool) -> None:
    make: list[float] = []
    copy: list[float] = []
    mount: list[float] = []
    umount: list[float] = []
    maker = ImageMaker(root / "templates", size, preallocate=preallocate)
    maker.start()
    for i in range(n):
        image, target = root / f"img{i}", root / f"mnt{i}"
        target.mkdir()
        make.append(timed(partial(create_image, image, size, preallocate=preallocate)))
        image.unlink()
        copy.append(timed(partial(maker.make, image, size)))
        mount.append(timed(partial(mount_image, image, target, discard=not preallocate)))
        umount.append(timed(partial(unmount, target)))
        image.unlink()
        target.rmdir()
    tag = ", preallocated" if preallocate else ""
    print(line(f"make image by mkfs.ext4 ({size // MIB} MiB{tag})", make))
    print(line(f"make image from the template ({size // MIB} MiB{tag})", copy[1:]))
    print(line("attach loop + mount", mount))
    print(line("lazy unmount", umount))


def bench_prepare(root: Path, n: int, size: int, preallocate: bool) -> None:
    limits = SandboxLimits(disk_bytes=size)
    launcher = SandboxLauncher(LauncherConfig(root / ("pre" if preallocate else "sparse"), limits,
                                              use_zygote=False, preallocate_disk=preallocate))
    launcher.start()
    prepare: list[float] = []
    destroy: list[float] = []
    try:
        for i in range(n):
            prepare.append(timed(partial(launcher.prepare, f"b{i}")))
            destroy.append(timed(partial(launcher.destroy_dirs, f"b{i}")))
    finally:
        launcher.stop()
    tag = ", preallocated" if preallocate else ""
    print(line(f"SandboxLauncher.prepare (disk on{tag})", prepare))
    print(line("SandboxLauncher.destroy_dirs", destroy))
    off = SandboxLauncher(LauncherConfig(root / "off", SandboxLimits(disk_bytes=0), use_zygote=False))
    off.start()
    times: list[float] = []
    try:
        for i in range(n):
            times.append(timed(partial(off.prepare, f"b{i}")))
            off.destroy_dirs(f"b{i}")
    finally:
        off.stop()
    if not preallocate:
        print(line("SandboxLauncher.prepare (disk quota off)", times))


def write_mb_s(directory: Path, mb: int) -> float:
    chunk = b"\1" * MIB
    path = directory / "write.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return mb / elapsed


def bench_write(root: Path, size: int, mb: int) -> None:
    plain = root / "plain"
    plain.mkdir()
    image, target = root / "wimg", root / "wmnt"
    target.mkdir()
    create_image(image, max(size, (mb + 64) * MIB), preallocate=False)
    mount_image(image, target, discard=True)
    try:
        for _ in range(2):  # the second round is the one to read: caches warmed alike
            host = write_mb_s(plain, mb)
            loop = write_mb_s(target, mb)
        print(f"sequential write + fsync, {mb} MiB: plain dir {host:7.0f} MiB/s, loop-mounted disk {loop:7.0f} MiB/s")
    finally:
        unmount(target)


def bench_meter(root: Path, n: int, size: int) -> None:
    launcher = SandboxLauncher(LauncherConfig(root / "meter", SandboxLimits(disk_bytes=size), use_zygote=False))
    launcher.start()
    try:
        paths = launcher.prepare("m")
        meter = ResourceMeter(None, paths.disk, SandboxLimits(disk_bytes=size))
        print(line("ResourceMeter.check (disk only, no cgroup)", [timed(meter.check) for _ in range(n * 10)]))
        launcher.destroy_dirs("m")
    finally:
        launcher.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40, help="samples per figure")
    parser.add_argument("--size-mb", type=int, default=1024, help="disk size")
    parser.add_argument("--write-mb", type=int, default=256, help="MiB written in the throughput part")
    args = parser.parse_args()
    size = args.size_mb * MIB
    root = Path(tempfile.mkdtemp(prefix="ashd-bd-", dir="/tmp"))
    try:
        bench_steps(root, args.n, size, preallocate=False)
        bench_steps(root, max(5, args.n // 4), size, preallocate=True)
        bench_prepare(root, args.n, size, preallocate=False)
        bench_prepare(root, max(5, args.n // 4), size, preallocate=True)
        bench_write(root, size, args.write_mb)
        bench_meter(root, args.n, size)
    finally:
        for mounted in root.glob("*mnt*"):
            unmount(mounted)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
