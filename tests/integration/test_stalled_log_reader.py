"""A server whose stderr nobody reads (a container's log driver or journald that stalls) goes on
answering: its log lines wait, or are dropped and counted, instead of stopping its event loop.
A real `ashd serve` process, its stderr a pipe this test does not read until the end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp

from tests.fixtures.cluster import free_port

REQUESTS = 800  # each logs "credential stored": several times a pipe's 64 KiB


async def test_a_server_whose_stderr_is_not_read_keeps_answering(short_tmp: Path) -> None:
    port = free_port()
    # No fork server: its mount namespace would hold a copy of other tests' sandbox disks' mounts,
    # and with them their loop devices, while this server runs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVICE_", "ASHD_"))}
    env.update({"SERVICE_DATA_DIR": str(short_tmp / "data"), "SERVICE_HOST": "127.0.0.1", "SERVICE_PORT": str(port),
                "SERVICE_PREWARM": "0", "SERVICE_ZYGOTE": "0", "SERVICE_LOG_LEVEL": "info", "SERVICE_RATE_LIMIT_RPS": "100000",
                "SERVICE_RATE_LIMIT_BURST": "100000", "SERVICE_TENANT_MAX_CREDENTIALS": str(REQUESTS),
                "ANTHROPIC_API_KEY": "sk-ant-test"})
    proc = subprocess.Popen([sys.executable, "-m", "ashd", "serve"], env=env, cwd=short_tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while True:
                    assert proc.poll() is None, "the server exited"
                    try:
                        async with http.get(url + "/health") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
            key = (short_tmp / "data" / "initial-api-key").read_text().strip()
            headers = {"Authorization": f"Bearer {key}"}
            # A plain write would block the loop once the pipe is full (about 300 requests in).
            async with asyncio.timeout(120):
                for i in range(REQUESTS):
                    async with http.post(url + "/api/credentials", headers=headers,
                                         json={"type": "anthropic", "key": f"sk-ant-api03-stalled-{i:05}"}) as resp:
                        assert resp.status == 201, await resp.text()
        # Read now: what was logged comes whole, as JSON lines.
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(proc.stderr.read() if proc.stderr else b""))
        reader.start()
        proc.terminate()
        assert proc.wait(30) == 0
        reader.join(30)
        lines = [json.loads(line) for line in got[0].splitlines() if line.strip()]
        stored = [line for line in lines if line.get("msg") == "credential stored"]
        dropped = sum(line.get("dropped", 0) for line in lines)
        assert len(stored) + dropped == REQUESTS
        assert lines[-1]["msg"] == "ashd stopped"  # what waited at the stop was written, in order
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
