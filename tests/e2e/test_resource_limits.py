"""Resource exhaustion is reported, not hidden (issues 9.4 and 18.1), through HTTP with real
sandboxes, real cgroups, a real disk image and the scripted fake model.

A tool that fills the sandbox's disk, is killed by the memory limit, or forks until the process
limit refuses: each time the client gets an `error` frame that names the limit, the tool result the
model reads says the same, the stored events record it, and the session keeps working.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing import SandboxPaths
from tests.conftest import Api, start_api
from tests.e2e.test_agent_runtime import block_text, text, tool, tool_results, turn
from tests.fixtures.sse import Frame

pytestmark = pytest.mark.sandbox
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MIB = 1024 * 1024
MEMORY_MB = 128
PIDS = 48
DISK_MB = 64


@pytest.fixture
async def limits_api(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:
    """A server whose data dir is a filesystem of the test's own, so its free space moves only with
    what this server stores."""
    fs = Path(settings.data_dir).parent / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=768m,mode=0700", "tmpfs", str(fs)], check=True)
    try:
        server, api = await start_api(aiohttp_client, settings.with_(
            data_dir=str(fs / "data"), zygote=True, prewarm=1, anthropic_base_url=fake_model.url,
            anthropic_api_key="sk-ant-limits", sandbox_memory_mb=MEMORY_MB, sandbox_pids=PIDS,
            sandbox_disk_mb=256))
        try:
            files = [{"path": "AGENT.md", "content": "You test limits."}] + [
                {"path": name, "content": (FIXTURES / name).read_text()} for name in ("memhog.py", "forkbomb.py")]
            status, body = await api.call("POST", "/api/agents", json={"name": "limits", "files": files})
            assert status == 201, body
            yield api
        finally:
            await api.client.close()
            await server.stop()
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


async def new_session(api: Api, **body: Any) -> dict[str, Any]:
    status, created = await api.call("POST", "/api/sessions", json={"agent": "limits", **body})
    assert status == 201, created
    return dict(created["session"])


def errors(frames: list[Frame]) -> list[dict[str, Any]]:
    return [f.data for f in frames if f.event == "error"]


async def stored_errors(api: Api, sid: str) -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=error")
    assert status == 200, body
    return [json.loads(e["data"]) for e in body["events"]]


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def test_writing_past_the_disk_quota_fails_is_reported_and_the_session_recovers(
        limits_api: Api, fake_model: FakeModel) -> None:
    api = limits_api
    status, health = await api.call("GET", "/health")
    assert health["isolation"]["diskQuota"] is True, health
    session = await new_session(api, diskMb=DISK_MB)
    assert session["diskMb"] == DISK_MB
    sid = session["id"]
    data_dir = Path(api.server.settings.data_dir)
    image = SandboxPaths(data_dir / "sandboxes" / session["sandboxId"]).image
    free_before = free_bytes(data_dir)

    fake_model.script("DQ-FILL", [
        {"content": [tool("Bash", command="dd if=/dev/zero of=big.bin bs=1M count=300")]},
        {"content": [text("the disk is full")]},
    ])
    frames = await turn(api, sid, "DQ-FILL go")
    result = tool_results(frames)[0]
    output = block_text(result)
    assert "No space left on device" in output  # the kernel refused the write inside the sandbox
    assert "[sandbox limit] disk quota reached" in output and f"{DISK_MB} MiB" in output
    assert result["is_error"] is True
    assert [e.get("limit") for e in errors(frames)] == ["disk"]
    assert f"disk of {DISK_MB} MiB" in errors(frames)[0]["error"]
    # The host paid at most the quota for it: the image is sparse and cannot grow past its size.
    assert free_before - free_bytes(data_dir) <= DISK_MB * MIB
    assert image.stat().st_blocks * 512 <= DISK_MB * MIB
    assert any(e.get("limit") == "disk" for e in await stored_errors(api, sid))

    # Still full: the model is told again, the client is not (it was told once).
    fake_model.script("DQ-STILL", [
        {"content": [tool("Bash", command="echo more >> big.bin")]}, {"content": [text("still full")]}])
    frames = await turn(api, sid, "DQ-STILL")
    assert "disk quota reached" in block_text(tool_results(frames)[0]) and errors(frames) == []

    # After removing files, writing works again, in the same session and sandbox.
    fake_model.script("DQ-FREE", [
        {"content": [tool("Bash", command="rm big.bin && echo written > small.txt && cat small.txt")]},
        {"content": [text("freed")]},
    ])
    frames = await turn(api, sid, "DQ-FREE")
    result = tool_results(frames)[0]
    assert block_text(result) == "written" and not result.get("is_error") and errors(frames) == []
    status, body = await api.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "active" and body["session"]["sandboxId"] == session["sandboxId"]


async def test_tmp_is_on_the_disk_and_not_in_memory(limits_api: Api, fake_model: FakeModel) -> None:
    """/tmp counts against the disk quota (a tmpfs would count against memory and end in OOM kills)."""
    api = limits_api
    sid = (await new_session(api))["id"]
    fake_model.script("DQ-TMP", [
        {"content": [tool("Bash", command="dd if=/dev/zero of=/tmp/big.bin bs=1M count=400; "
                                          "rm /tmp/big.bin; echo tmp-ok")]},
        {"content": [text("done")]},
    ])
    frames = await turn(api, sid, "DQ-TMP")
    output = block_text(tool_results(frames)[0])
    assert "No space left on device" in output and "tmp-ok" in output
    assert [e.get("limit") for e in errors(frames)] in (["disk"], [])  # freed again before the check
    assert not any(e.get("limit") == "memory" for e in errors(frames))


async def test_a_tool_killed_by_the_memory_limit_is_reported_and_the_session_recovers(
        limits_api: Api, fake_model: FakeModel) -> None:
    api = limits_api
    sid = (await new_session(api))["id"]
    fake_model.script("MEM-HOG", [
        {"content": [tool("Bash", command="python3 memhog.py 1024")]},
        {"content": [text("that was too much")]},
    ])
    frames = await turn(api, sid, "MEM-HOG go")
    result = tool_results(frames)[0]
    output = block_text(result)
    assert "did not hold" not in output
    assert "[sandbox limit] out of memory" in output and f"memory limit of {MEMORY_MB} MiB" in output
    assert result["is_error"] is True
    reported = errors(frames)
    assert [e.get("limit") for e in reported] == ["memory"]
    assert f"memory limit of {MEMORY_MB} MiB" in reported[0]["error"]
    assert any(e.get("limit") == "memory" for e in await stored_errors(api, sid))
    status, metrics = await api.call("GET", "/metrics")
    assert 'ash_sandbox_limit_hits_total{limit="memory"} 1.0' in metrics

    fake_model.script("MEM-AFTER", [{"content": [tool("Bash", command="echo alive")]}, {"content": [text("ok")]}])
    frames = await turn(api, sid, "MEM-AFTER")
    assert block_text(tool_results(frames)[0]) == "alive" and errors(frames) == []


async def test_a_fork_refused_by_the_process_limit_is_reported_and_the_session_recovers(
        limits_api: Api, fake_model: FakeModel) -> None:
    api = limits_api
    sid = (await new_session(api))["id"]
    # The bomb's children keep their pids after it exits (its output goes to a file, not the tool).
    fake_model.script("PIDS-BOMB", [
        {"content": [tool("Bash", command="python3 forkbomb.py > bomb.json 2>&1")]},
        {"content": [text("so many processes")]},
    ])
    frames = await turn(api, sid, "PIDS-BOMB go")
    result = tool_results(frames)[0]
    output = block_text(result)
    assert "[sandbox limit] process limit reached" in output and f"at most {PIDS} processes" in output
    assert "were stopped" in output and result["is_error"] is True
    reported = errors(frames)
    assert [e.get("limit") for e in reported] == ["pids"]
    assert f"at most {PIDS} processes" in reported[0]["error"]
    assert any(e.get("limit") == "pids" for e in await stored_errors(api, sid))

    fake_model.script("PIDS-AFTER", [{"content": [tool("Bash", command="cat bomb.json")]}, {"content": [text("ok")]}])
    frames = await turn(api, sid, "PIDS-AFTER")
    result = tool_results(frames)[0]
    assert not result.get("is_error") and errors(frames) == []
    assert json.loads(block_text(result))["refused"]  # the bomb really was refused a fork


async def test_disk_sizes_are_checked_against_the_operator_maximum(limits_api: Api) -> None:
    api = limits_api
    top = api.server.settings.sandbox_disk_max_mb
    for bad in (top + 1, 8, "64", True):
        status, body = await api.call("POST", "/api/sessions", json={"agent": "limits", "diskMb": bad})
        assert status == 400 and "diskMb" in body["error"] and str(top) in body["error"], body
    status, body = await api.call("PATCH", "/api/agents/limits", json={"diskMb": top + 1})
    assert status == 400 and "diskMb" in body["error"]
    status, body = await api.call("PATCH", "/api/agents/limits", json={"diskMb": 96})
    assert status == 200 and body["agent"]["diskMb"] == 96
    session = await new_session(api)  # the agent's size applies, and is kept with the session
    assert session["diskMb"] == 96
    paths = SandboxPaths(Path(api.server.settings.data_dir) / "sandboxes" / session["sandboxId"])
    assert paths.image.stat().st_size == 96 * MIB
    status, body = await api.call("PATCH", "/api/agents/limits", json={"diskMb": None})
    assert status == 200 and body["agent"]["diskMb"] is None
