"""`scripts/bench_sessions.py --compare`: the speed table run beside another server of this interface.

Its figures are never judged here (tests do not fail on timing); what is checked is that the mode
runs to its end against a real second server, reached only over HTTP as the reference
implementation was (`/health`'s pool read to settle both before each round, the cold rows), and
prints every row with a ratio; and that its client sends a request with no body as the published
SDKs do, with no Content-Type (aiohttp's default, octet-stream, made the reference's Fastify
answer every pause 415)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.e2e.test_serve_process import fake_model_process, free_port, http, server_log, start, stop  # noqa: F401

pytestmark = pytest.mark.sandbox

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench_sessions.py"
ROWS = ("create session (pre-warmed sandbox)", "DELETE a session", "GET a session", "pause", "warm resume",
        "message -> first message frame", "the same, less the model's first byte", "cold resume (after stop)",
        "create session (no warm sandbox)", "4 creates at once, no warm sandbox (each)")


def test_compare_mode_runs_every_row_against_another_server(short_tmp: Path,
                                                            fake_model_process: str) -> None:  # noqa: F811
    data, port = short_tmp / "other", free_port()
    other = start(data, port, ANTHROPIC_BASE_URL=fake_model_process, ANTHROPIC_API_KEY="sk-ant-compare",
                  SERVICE_RATE_LIMIT_RPS="100000", SERVICE_RATE_LIMIT_BURST="100000")
    try:
        url, key = f"http://127.0.0.1:{port}", (data / "initial-api-key").read_text().strip()
        status, body = http("POST", f"{url}/api/agents", key, {"name": "theirs", "systemPrompt": "You compare."})
        assert status == 201, body
        result = subprocess.run(
            [sys.executable, str(BENCH), "--n", "1", "--compare", url, key, "--compare-agent", "theirs",
             "--compare-cold-agent", "theirs", "--compare-pid", str(other.pid)],
            capture_output=True, text=True, timeout=240, cwd=short_tmp)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{server_log(other)}"
        for row in ROWS:
            found = re.search(rf"^\s*{re.escape(row)}\s+[\d.]+ \(\s*[\d.]+\) ms\s+[\d.]+ \(\s*[\d.]+\) ms\s+[\d.]+x$",
                              result.stdout, re.MULTILINE)
            assert found, f"{row!r} missing or malformed:\n{result.stdout}"
        cpu = re.search(r"^server CPU during each.*ashd · other: (.*) ms$", result.stdout, re.MULTILINE)
        assert cpu and cpu.group(1).count("·") == 11, result.stdout  # six rows, two servers each
    finally:
        stop(other)


async def test_a_request_without_a_body_has_no_content_type() -> None:
    spec = importlib.util.spec_from_file_location("bench_sessions", BENCH)
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/x", record)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            client = bench.Client(session, f"http://127.0.0.1:{port}", "k")
            await client.call("POST", "/x")
            await client.call("POST", "/x", {"a": 1})
    finally:
        await runner.cleanup()
    assert "Content-Type" not in seen[0] and seen[0].get("Content-Length") == "0"
    assert seen[1]["Content-Type"] == "application/json"
