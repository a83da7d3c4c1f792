"""Start-up sweep: whatever a killed server left behind in our cgroups and sandbox dirs goes."""

from __future__ import annotations

import contextlib
import logging
import time
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
        leftovers = tree.existing()
        for cg in leftovers:
            killed += len(cg.pids())
            cg.kill_all()
        # Killed together, drained under one deadline: their parents (bwrap's monitors, the zygote)
        # died with the old server, so the host's init reaps their pid-1s, and it may take its time.
        deadline = time.monotonic() + REMOVE_TIMEOUT
        for cg in leftovers:
            cg.kill_and_remove(max(0.0, deadline - time.monotonic()))
    if tree is not None:
        tree.sweep_empty_parents()
    for sock in (data_dir / "sandboxes").glob("*/disk/run/*.sock"):
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    if killed:
        log.warning("killed %d leftover sandbox processes from a previous run", killed)
    return killed
