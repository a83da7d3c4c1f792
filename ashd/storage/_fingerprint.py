"""A workspace's fingerprint: is the tree the same as when its latest snapshot was taken?

A snapshot costs a tar, a gzip and two fsyncs; a fingerprint costs one `lstat` per entry. When the
tree is unchanged since the latest snapshot (a pause, a resume and a DELETE with no turn between,
say), that snapshot already holds it and no new one is written.

Equal fingerprints mean an unchanged tree because a change to an entry changes its ctime (writes,
renames, chmod, links) or its directory's (entries added or removed), and a replaced file has a
new inode. One case would escape: a change made within the same clock tick as the entry's last
one leaves its timestamps equal on kernels that stamp files with a coarse clock (git calls such an
entry "racily clean"). So a fingerprint is only given when every entry is older than a settling
time at the moment it is taken; otherwise the snapshot is taken. The settling time is ten ticks of
the clock the data disk's files are actually stamped with, measured once (`settle_ns_for`): a
coarse 100 Hz clock gives 100 ms; kernels with fine-grained timestamps give the 20 ms floor.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from ashd.storage._files import MAX_ENTRIES, walk

SETTLE_NS = 100_000_000  # when the tick could not be measured: ten ticks of a 100 Hz clock
MIN_SETTLE_NS = 20_000_000


def settle_ns_for(directory: Path, rounds: int = 100) -> int:
    """Ten times the smallest step between the timestamps of a file rewritten in a loop in
    `directory` (its filesystem's tick), at least MIN_SETTLE_NS; SETTLE_NS if it cannot be seen."""
    probe = directory / ".timestamp-probe"
    steps: list[int] = []
    try:
        last = None
        for _ in range(rounds):
            probe.write_bytes(b"x")
            stamp = os.stat(probe).st_mtime_ns
            if last is not None and stamp != last:
                steps.append(stamp - last)
            last = stamp
    except OSError:
        return SETTLE_NS
    finally:
        probe.unlink(missing_ok=True)
    return max(MIN_SETTLE_NS, 10 * min(steps)) if steps else SETTLE_NS


def workspace_fingerprint(workspace: Path, settle_ns: int = SETTLE_NS) -> bytes | None:
    """A digest of the mode, size, inode, mtime and ctime of `workspace` and of every entry a
    snapshot of it would hold (excluded directories are left out, as the snapshot leaves them; links
    are not followed); None when an entry changed within `settle_ns`, the tree could not be read or
    is too large to be listed whole (then nothing can be concluded from it).

    The tree is the sandbox's and changes under the walk: it is listed with `walk`, which never
    leaves it (a directory swapped for a link to a host path is not followed)."""
    digest = hashlib.blake2b(digest_size=20)
    horizon = time.time_ns() - settle_ns
    try:
        root = os.lstat(workspace)
        if not stat.S_ISDIR(root.st_mode) or _recent(root, horizon):
            return None
        digest.update(f"{workspace}\0{_describe(root)}".encode(errors="surrogateescape"))
        count = 0
        for rel, entry in walk(workspace):
            count += 1
            st = entry.stat(follow_symlinks=False)
            if _recent(st, horizon):
                return None
            digest.update(f"\n{rel}\0{_describe(st)}".encode(errors="surrogateescape"))
    except OSError:
        return None
    if count >= MAX_ENTRIES:
        return None
    return digest.digest()


def _recent(st: os.stat_result, horizon: int) -> bool:
    return st.st_mtime_ns > horizon or st.st_ctime_ns > horizon


def _describe(st: os.stat_result) -> str:
    return f"{st.st_mode}\0{st.st_size}\0{st.st_ino}\0{st.st_dev}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
