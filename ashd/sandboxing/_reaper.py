"""Start-up sweep: whatever a killed server left behind in our cgroups and sandbox dirs goes."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from ashd.sandboxing._cgroups import CgroupTree, detect_version

log = logging.getLogger(__name__)

REMOVE_TIMEOUT = 10.0


def reap_leftovers(data_dir: Path, tree: CgroupTree | None = None) -> int:
    """Kill leftover sandbox processes found in our cgroups, remove those cgroups and any stale
    sockets under `<data_dir>/sandboxes/*/disk/run/`. Returns how many processes were killed."""
    killed = 0
    if tree is None and detect_version() != "none":
        tree = CgroupTree(data_dir)
    if tree is not None:
        pause = threading.Event()
        for cg in tree.existing():
            pids = cg.pids()
            killed += len(pids)
            for _ in range(int(REMOVE_TIMEOUT / 0.01)):
                cg.kill_all()
                if cg.remove():
                    break
                # Killed processes stay members until their parent (often init) reaps them.
                pause.wait(0.01)
            else:
                log.error("leftover sandbox cgroup %s could not be removed", cg.dirs)
    if tree is not None:
        tree.sweep_empty_parents()
    for sock in (data_dir / "sandboxes").glob("*/disk/run/*.sock"):
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    if killed:
        log.warning("killed %d leftover sandbox processes from a previous run", killed)
    return killed
