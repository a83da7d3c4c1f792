"""The zygote's clone3 with CLONE_INTO_CGROUP: a sandbox's init born in its cgroup v2 directory.

This machine kind runs cgroup v1 for its controllers but mounts a cgroup2 hierarchy too, which is
enough to see the mechanism that v2 hosts use for every sandbox: the child is in the cgroup from
its first instruction, and is the pid 1 of its own pid namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox

CHILD = """
import json, os, sys
from ashd.zygote import _child as child
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
r, w = os.pipe()
pid = child.fork_into_new_pid_namespace(fd)
if pid == 0:
    os.write(w, json.dumps({"pid": os.getpid(), "cgroup": open("/proc/self/cgroup").read()}).encode())
    os._exit(0)
os.close(w)
seen = json.loads(os.read(r, 65536))
_, status = os.waitpid(pid, 0)
print(json.dumps({"seen": seen, "status": status, "host_pid": pid}))
"""


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture
def v2_dir() -> Iterator[Path]:
    mount = _cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        pytest.skip("no cgroup2 hierarchy mounted here, or not root")
    directory = mount / f"ashd-test-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        yield directory
    finally:
        directory.rmdir()


def test_the_init_is_born_in_its_cgroup_as_pid_1(v2_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, str(v2_dir)], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == 0
    assert result["seen"]["pid"] == 1
    v2_line = next(line for line in result["seen"]["cgroup"].splitlines() if line.startswith("0::"))
    assert v2_line.endswith("/" + v2_dir.name)


def test_a_kernel_refusal_forks_nothing_and_says_so(tmp_path: Path) -> None:
    """A directory that is not a cgroup: clone3 fails (EBADF/EINVAL...), no child is made, and the
    zygote falls back to the plain clone and a join by write."""
    code = CHILD.replace("pid = child.fork_into_new_pid_namespace(fd)",
                         "try:\n    pid = child.fork_into_new_pid_namespace(fd)\n"
                         "except OSError as exc:\n    print(json.dumps({'errno': exc.errno})); sys.exit(0)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "errno" in json.loads(out.stdout)
