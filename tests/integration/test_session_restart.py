"""A real `python -m ashd serve` killed with SIGKILL and started again: nothing stored is lost,
sessions come back `paused`, and a cold resume restores files and conversation, also from a
sandbox disk image that is no longer mounted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing import SandboxPaths
from ashd.sandboxing._disk import loop_devices_of
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.sse import parse_frames

pytestmark = pytest.mark.sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(self, settings: Settings, fake_url: str) -> None:
        self.port = _free_port()
        self.env = {**os.environ, "SERVICE_DATA_DIR": settings.data_dir, "SERVICE_PORT": str(self.port),
                    "SERVICE_HOST": "127.0.0.1", "SERVICE_DATABASE_URL": settings.effective_database_url,
                    "SERVICE_PREWARM": "0", "ANTHROPIC_BASE_URL": fake_url, "ANTHROPIC_API_KEY": "x"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}"
        # Where the server's log lines go (appended): shown when it exits during a start.
        self.log: Path = Path(settings.data_dir).parent / f"server-{self.port}.log"

    async def start(self) -> str:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "ashd", "serve"], env=self.env,
                                         stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        async with asyncio.timeout(60), aiohttp.ClientSession() as http:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"the server exited during start ({self.proc.returncode}):\n{self.tail(20)}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{self.url}/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
        return (Path(self.env["SERVICE_DATA_DIR"]) / "initial-api-key").read_text().strip()

    def tail(self, lines: int = 40) -> str:
        """The server's last log lines, for an assertion's message."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own process group only


@pytest.fixture
def proc(settings: Settings, fake_model: FakeModel) -> Iterator[Proc]:  # noqa: F811
    p = Proc(settings, fake_model.url)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _call(http: aiohttp.ClientSession, p: Proc, key: str, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, p.url + path, headers={"Authorization": f"Bearer {key}"}, **kw) as resp:
        text = await resp.text()
        if resp.content_type == "text/event-stream":
            return resp.status, parse_frames(text)
        return resp.status, json.loads(text)


async def _sessions_that_wrote(p: Proc, http: aiohttp.ClientSession, key: str, model: FakeModel, name: str,
                               count: int) -> list[str]:
    """`count` sessions of a new agent `helper`, each of which wrote /workspace/<name>.txt ("<name> file")
    in a turn (prompt "remember-<name> now")."""
    status, body = await _call(http, p, key, "POST", "/api/agents",
                               json={"name": "helper", "systemPrompt": "You are helpful."})
    assert status == 201, body
    model.script(f"remember-{name}", [
        {"content": [{"type": "tool_use", "name": "Write",
                      "input": {"file_path": f"/workspace/{name}.txt", "content": f"{name} file"}}]},
        {"content": [{"type": "text", "text": "stored"}]},
    ])
    sids = []
    for _ in range(count):
        status, body = await _call(http, p, key, "POST", "/api/sessions", json={"agent": "helper"})
        assert status == 201, body
        sids.append(body["session"]["id"])
        status, frames = await _call(http, p, key, "POST", f"/api/sessions/{sids[-1]}/messages",
                                     json={"content": f"remember-{name} now"})
        assert status == 200 and frames[-1].event == "done"
    return sids


async def test_sigkill_and_restart(proc: Proc, http: aiohttp.ClientSession, fake_model: FakeModel) -> None:  # noqa: F811
    key = await proc.start()
    sids = await _sessions_that_wrote(proc, http, key, fake_model, "alpha", 3)
    # the second one is paused (a snapshot is taken); the first stays active: no snapshot at all
    status, body = await _call(http, proc, key, "POST", f"/api/sessions/{sids[1]}/pause")
    assert status == 200
    before = {}
    for sid in sids:
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/messages")
        before[sid] = body["messages"]

    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sids[0]}")
    disk = SandboxPaths(Path(proc.env["SERVICE_DATA_DIR"]) / "sandboxes" / body["session"]["sandboxId"]).disk
    # The third is deleted just before the kill: `ended` is stored and answered at once, its final
    # snapshot taken after the answer (in a quiet moment); killed before or after that, its files
    # must be there after the restart (else the restart's rescue takes them from its workspace).
    ended = sids.pop()
    status, body = await _call(http, proc, key, "DELETE", f"/api/sessions/{ended}")
    assert status == 200 and body["session"]["status"] == "ended"
    proc.kill()
    # The sandbox disks stay mounted after a SIGKILL; after a reboot they would not be: the rescue
    # must mount the image again to read the first session's files (it has no snapshot at all).
    assert os.path.ismount(disk)
    subprocess.run(["umount", "-l", str(disk)], check=True)
    key = await proc.start()

    for sid in sids:
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}")
        assert status == 200 and body["session"]["status"] == "paused"
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/messages")
        assert body["messages"] == before[sid]
        # the files the agent wrote before the kill are readable, from the snapshot
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/files")
        assert status == 200, (sids.index(sid), body, proc.tail())
        assert body["source"] == "snapshot" and "alpha.txt" in {f["path"] for f in body["files"]}
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sids[0]}/events?type=lifecycle")
    assert json.loads(body["events"][-1]["data"])["reason"] == "restart"
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{ended}")
    assert status == 200 and body["session"]["status"] == "ended"
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{ended}/files/alpha.txt",
                               params={"format": "json"})
    assert status == 200 and body["content"] == "alpha file" and body["source"] == "snapshot"

    for sid in sids:
        status, body = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/resume")
        assert status == 200 and body["session"]["status"] == "active"
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/files/alpha.txt",
                                   params={"format": "json"})
        assert status == 200 and body["content"] == "alpha file" and body["source"] == "sandbox"
        token = f"after-restart-{sid}"
        status, frames = await _call(http, proc, key, "POST", f"/api/sessions/{sid}/messages",
                                     json={"content": token})
        assert status == 200 and frames[-1].event == "done"
        # the model sees the conversation from before the kill
        request = fake_model.requests_containing(token)[-1]
        assert "remember-alpha now" in json.dumps(request["body"]["messages"])
    async with http.get(f"{proc.url}/metrics") as resp:
        assert 'ash_resume_total{path="cold"} 2.0' in await resp.text()


async def test_another_server_on_the_host_holds_none_of_this_ones_disks(
        proc: Proc, http: aiohttp.ClientSession, fake_model: FakeModel) -> None:  # noqa: F811
    """A second ashd on the host (its own data dir and database) starts while this one's sandbox disk
    is mounted: its fork server's private mount namespace copies the host's table then, and must
    leave that disk out. A copy would hold the disk's filesystem, and its loop device, for as long as
    the other server runs; a restart of this one after a kill would wait for the leftover image to
    let go, give up, and serve the session without its files (CI saw that 404 once another test's
    server started at the wrong moment)."""
    key = await proc.start()
    [sid] = await _sessions_that_wrote(proc, http, key, fake_model, "gamma", 1)
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}")
    paths = SandboxPaths(Path(proc.env["SERVICE_DATA_DIR"]) / "sandboxes" / body["session"]["sandboxId"])
    assert loop_devices_of(paths.image)
    other_dir = Path(tempfile.mkdtemp(prefix="ashd-", dir="/tmp"))
    other = Proc(Settings(data_dir=str(other_dir / "data")), fake_model.url)
    try:
        await other.start()  # its fork server's namespace is made now, with the disk mounted
        assert other.proc is not None
        held = {p.pid: Path(f"/proc/{p.pid}/mountinfo").read_text()
                for p in psutil.Process(other.proc.pid).children(recursive=True)}
        assert held and not [pid for pid, table in held.items() if f" {paths.disk} " in table]

        proc.kill()
        subprocess.run(["umount", "-l", str(paths.disk)], check=True)
        key = await proc.start()
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/files/gamma.txt",
                                   params={"format": "json"})
        assert status == 200, (body, proc.tail())
        assert body["content"] == "gamma file" and body["source"] == "snapshot"
    finally:
        other.stop()
        shutil.rmtree(other_dir, ignore_errors=True)


async def test_a_stopped_server_takes_the_snapshots_it_owes_before_its_sandboxes_go(
        proc: Proc, http: aiohttp.ClientSession, fake_model: FakeModel) -> None:  # noqa: F811
    """A pause's snapshot and a DELETE's final one are taken after their answers; a server told to
    stop (SIGTERM) right after takes them before its sandboxes, and their workspaces, go."""
    key = await proc.start()
    sids = await _sessions_that_wrote(proc, http, key, fake_model, "beta", 2)
    status, _ = await _call(http, proc, key, "POST", f"/api/sessions/{sids[0]}/pause")
    assert status == 200
    status, _ = await _call(http, proc, key, "DELETE", f"/api/sessions/{sids[1]}")
    assert status == 200
    proc.stop()
    sandboxes = Path(proc.env["SERVICE_DATA_DIR"]) / "sandboxes"
    assert not [d for d in sandboxes.glob("sb-*") if d.is_dir()]  # a clean stop leaves nothing to rescue
    key = await proc.start()
    for sid in sids:
        status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/files/beta.txt",
                                   params={"format": "json"})
        assert status == 200 and body["content"] == "beta file" and body["source"] == "snapshot", body


async def test_a_leftover_workspace_that_cannot_be_read_is_kept_for_a_later_start(
        proc: Proc, http: aiohttp.ClientSession, fake_model: FakeModel) -> None:  # noqa: F811
    """A killed server's workspace is a session's newest files. When the next start cannot read it
    (its disk image will not mount), the directory stays and the server starts anyway; a later
    start, the image readable again, takes the files from it."""
    key = await proc.start()
    (sid,) = await _sessions_that_wrote(proc, http, key, fake_model, "gamma", 1)
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}")
    paths = SandboxPaths(Path(proc.env["SERVICE_DATA_DIR"]) / "sandboxes" / body["session"]["sandboxId"])
    proc.kill()
    subprocess.run(["umount", "-l", str(paths.disk)], check=True)  # a reboot: the image is mounted nowhere
    await _detached(paths.image)
    with paths.image.open("r+b") as image:  # ext4's primary superblock, 1 KiB at 1 KiB: gone, no mount
        image.seek(1024)
        superblock = image.read(1024)
        image.seek(1024)
        image.write(bytes(1024))

    key = await proc.start()
    assert paths.root.is_dir() and paths.image.exists()
    assert "could not read the workspace of a sandbox left by the previous process; keeping it" in \
        proc.log.read_text()
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "paused"
    proc.stop()

    await _detached(paths.image)
    with paths.image.open("r+b") as image:
        image.seek(1024)
        image.write(superblock)
    key = await proc.start()
    status, body = await _call(http, proc, key, "GET", f"/api/sessions/{sid}/files/gamma.txt",
                               params={"format": "json"})
    assert status == 200 and body["content"] == "gamma file" and body["source"] == "snapshot", body
    assert not paths.image.exists()  # rescued, then removed


async def _detached(image: Path) -> None:
    """Until no loop device holds `image`: a lazily unmounted filesystem lets go once its last user
    (a sandbox the kill took down) has exited."""
    async with asyncio.timeout(60):
        while loop_devices_of(image):
            await asyncio.sleep(0.05)
