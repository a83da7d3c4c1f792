"""The bridge's orphan reaper, with real processes: a helper process made a child subreaper (so the
kernel hands it orphans as it hands them a pid 1) runs the reaper beside asyncio subprocesses.

What must hold: every exit status asyncio waits for reaches it intact (the reaper never takes a
child someone waits for), and every orphan is reaped: at once when it is in another session, after
the grace when it leads its own (a daemon's `setsid`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HELPER = r"""
import asyncio, ctypes, json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ashd.bridge._reaper import OrphanReaper, zombie_children

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
DAEMON = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.2)\n    os._exit(0)\nos._exit(0)"


async def run(*argv, new_session=True):
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=new_session)
    return await proc.wait()


async def main():
    reaper = OrphanReaper(asyncio.get_running_loop(), grace=0.5)
    reaper.install()
    out = {}
    # Many of our own children exiting at once, each leaving an orphan that exits soon after.
    codes = await asyncio.gather(*(run("sh", "-c", f"sleep 0.1 & exit {n}") for n in range(24)),
                                 *(run("sh", "-c", f"exit {n}", new_session=False) for n in range(24)))
    out["codes"] = list(codes)
    await asyncio.sleep(0.4)  # the orphans (in their shell's session) are gone, with no grace
    out["after_orphans"] = len(zombie_children(os.getpid()))
    out["reaped_orphans"] = reaper.reaped
    # A daemon: its second process leads its own session, so it waits out the grace.
    assert await run(sys.executable, "-c", DAEMON, new_session=False) == 0
    t0 = time.monotonic()
    while zombie_children(os.getpid()) == [] and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.01)
    out["daemon_seen_as_zombie"] = len(zombie_children(os.getpid()))
    while zombie_children(os.getpid()) and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.01)
    out["daemon_left_after"] = time.monotonic() - t0
    out["after_daemon"] = len(zombie_children(os.getpid()))
    out["reaped"] = reaper.reaped
    reaper.close()
    print(json.dumps(out))


asyncio.run(main())
"""


def test_orphans_are_reaped_and_our_own_childrens_statuses_are_kept() -> None:
    result = subprocess.run([sys.executable, "-I", "-c", HELPER, str(ROOT)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["codes"] == list(range(24)) * 2
    assert out["after_orphans"] == 0
    assert out["reaped_orphans"] >= 24
    assert out["daemon_seen_as_zombie"] == 1
    assert out["after_daemon"] == 0
    assert out["daemon_left_after"] >= 0.4  # the grace: it could have been a child someone waits for
    assert out["reaped"] == out["reaped_orphans"] + 1
