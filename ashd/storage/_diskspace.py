"""Free space on the data dir's filesystem: measured, reported, and kept in reserve.

The data dir holds the SQLite database, sandbox workspaces, snapshots and uploaded agents. When it
fills, every tenant's writes fail at once. So below a reserve (`SERVICE_DATA_DIR_MIN_FREE_MB`) the
server stops taking requests that add stored data (507), which leaves the reserve to what is already
under way: running turns storing their frames, snapshots at pause/stop, the database's own upkeep
(WAL checkpoints). Above the reserve again, those requests are taken again: nothing to restart.

`statvfs` costs about a microsecond, so every check measures afresh; there is no cache to go stale.
Free space is `f_bavail` (what an unprivileged writer may use), the cautious figure: a server running
as root could also use the filesystem's root-reserved blocks, which is extra headroom, not less.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ashd.errors import StorageFull

log = logging.getLogger(__name__)
MIB = 1024 * 1024
STATES = ("ok", "low", "full")


@dataclass(frozen=True)
class DiskSpace:
    free_bytes: int
    total_bytes: int
    state: str  # ok | low (below the warning level) | full (below the reserve)

    def to_json(self, min_free: int, warn_free: int) -> dict[str, object]:
        return {"state": self.state, "freeBytes": self.free_bytes, "totalBytes": self.total_bytes,
                "minFreeBytes": min_free, "warnFreeBytes": warn_free}


def free_bytes(path: Path) -> int:
    """Bytes free for an unprivileged writer on `path`'s filesystem."""
    return _free(os.statvfs(path))


def _free(st: os.statvfs_result) -> int:
    return st.f_bavail * st.f_frsize


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


class DataDirSpace:
    def __init__(self, path: Path, min_free_bytes: int, warn_free_bytes: int) -> None:
        self.path = path
        self.min_free = min_free_bytes
        self.warn_free = max(warn_free_bytes, min_free_bytes)
        self._last_state = "ok"

    def measure(self) -> DiskSpace:
        st = os.statvfs(self.path)
        free, total = _free(st), st.f_blocks * st.f_frsize
        state = "full" if free < self.min_free else "low" if free < self.warn_free else "ok"
        if state != self._last_state:
            self._log_change(state, free)
            self._last_state = state
        return DiskSpace(free, total, state)

    def _log_change(self, state: str, free: int) -> None:
        extra = {"dataDir": str(self.path), "freeBytes": free, "state": state}
        if state == "full":
            log.error("data disk below its reserve (%s free, reserve %s): requests that add stored data "
                      "are refused with 507 until space is freed", _mib(free), _mib(self.min_free), extra=extra)
        elif state == "low":
            log.warning("data disk is getting full (%s free, warning level %s)", _mib(free),
                        _mib(self.warn_free), extra=extra)
        else:
            log.info("data disk has room again (%s free)", _mib(free), extra=extra)

    def require_room(self, what: str | Callable[[], str]) -> None:
        """Refuse `what` (a phrase: "a new session", ..., or what makes it, called only to refuse)
        with 507 while below the reserve."""
        space = self.measure()
        if space.state == "full":
            if callable(what):
                what = what()
            raise StorageFull(
                f"The server's data disk is nearly full ({_mib(space.free_bytes)} free, "
                f"{_mib(self.min_free)} kept in reserve for work under way), so {what} is refused. "
                "Nothing stored was lost and reads keep working; retry once the operator has freed space"
            )
