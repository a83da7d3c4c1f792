"""A sandbox's /dev on both launch routes: the six devices a program expects, working, and nothing
the sandbox user can add to it (the zygote route makes the nodes with mknod, bwrap binds the host's).
"""

from __future__ import annotations

import json
import sys

import pytest

from ashd.sandboxing import SandboxLauncher
from tests.fixtures.sandboxes import (
    bridge_exec,
    launch_bridge,
    route_launcher,  # noqa: F401 (the `launcher` fixture)
    stop_sandbox,
)

pytestmark = pytest.mark.sandbox

PROBE = r"""
import errno, json, os, stat
out = {"nodes": {}}
for name in ("null", "zero", "full", "random", "urandom", "tty"):
    st = os.stat("/dev/" + name)
    out["nodes"][name] = [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev),
                          oct(stat.S_IMODE(st.st_mode))]
with open("/dev/null", "wb") as f:
    f.write(b"gone")
with open("/dev/zero", "rb") as f:
    out["zero"] = f.read(4) == b"\0" * 4
with open("/dev/urandom", "rb") as f:
    out["urandom"] = len(f.read(16))
try:
    with open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x")
    out["full"] = "written"
except OSError as exc:
    out["full"] = errno.errorcode[exc.errno]
for what, attempt in (("create", lambda: open("/dev/mine", "w")),
                      ("mknod", lambda: os.mknod("/dev/mem", stat.S_IFCHR | 0o666, os.makedev(1, 1))),
                      ("mknod_shm", lambda: os.mknod("/dev/shm/mem", stat.S_IFCHR | 0o666, os.makedev(1, 1)))):
    try:
        attempt()
        out[what] = "allowed"
    except OSError as exc:
        out[what] = errno.errorcode[exc.errno]
with open("/dev/shm/ok", "w") as f:
    f.write("shared memory")
out["shm"] = os.path.getsize("/dev/shm/ok")
print(json.dumps(out))
"""


def test_dev_has_working_devices_and_nothing_can_be_added(launcher: SandboxLauncher) -> None:
    proc = launch_bridge(launcher, "dev-probe")
    try:
        result = bridge_exec(proc, [sys.executable, "-I", "-c", PROBE])
        assert result["exitCode"] == 0, result
        out = json.loads(str(result["stdout"]))
        assert out["nodes"] == {
            "null": [True, 1, 3, "0o666"], "zero": [True, 1, 5, "0o666"], "full": [True, 1, 7, "0o666"],
            "random": [True, 1, 8, "0o666"], "urandom": [True, 1, 9, "0o666"], "tty": [True, 5, 0, "0o666"],
        }
        assert out["zero"] is True and out["urandom"] == 16 and out["full"] == "ENOSPC"
        # No device can be added: the sandbox user has no CAP_MKNOD (and on the zygote route, where
        # /dev is not mounted nodev, cannot write to it at all; bwrap's /dev is the sandbox user's
        # own tmpfs in its user namespace, nodev).
        assert out["mknod"] in ("EPERM", "EACCES") and out["mknod_shm"] == "EPERM"
        if launcher._zygote is not None:
            assert out["create"] == "EACCES"
        assert out["shm"] == len("shared memory")
    finally:
        stop_sandbox(proc)
