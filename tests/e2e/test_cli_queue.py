"""`ashd queue add|list|show|cancel|stats` against a real `ashd serve` process. The server runs no
queue items (SERVICE_QUEUE_CONCURRENCY=0), so every item stays where the commands put it; running
them is tests/integration/test_queue.py's and tests/e2e/test_queue_processes.py's part."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_cli import Server, ashd
from tests.e2e.test_serve_process import free_port, http, start, stop


@pytest.fixture
def idle_queue(short_tmp: Path) -> Iterator[Server]:
    data, port = short_tmp / "data", free_port()
    proc = start(data, port, SERVICE_QUEUE_CONCURRENCY="0", SERVICE_PREWARM="0", SERVICE_TENANT_MAX_QUEUED="2")
    try:
        yield Server(f"http://127.0.0.1:{port}", (data / "initial-api-key").read_text().strip(), data, "", proc)
    finally:
        stop(proc)


def test_queue_commands(idle_queue: Server) -> None:
    server = idle_queue
    status, body = http("POST", f"{server.url}/api/agents", server.key, {"name": "helper", "systemPrompt": "Hi."})
    assert status == 201, body
    first = ashd(server, "queue", "add", "helper", "summarise the report").stdout.strip()
    second = json.loads(ashd(server, "queue", "add", "helper", "urgent one", "--priority", "7",
                             "--max-retries", "0", "--json").stdout)
    assert second["priority"] == 7 and second["maxRetries"] == 0 and second["status"] == "pending"

    listing = ashd(server, "queue", "list").stdout
    assert first in listing and second["id"] in listing and "pending" in listing
    rows = json.loads(ashd(server, "queue", "list", "--json", "--limit", "1").stdout)
    assert [r["id"] for r in rows] == [second["id"]]  # newest first

    shown = ashd(server, "queue", "show", first).stdout
    assert "summarise the report" in shown and "pending" in shown
    assert ashd(server, "queue", "cancel", first).stdout.strip() == f"{first} cancelled"
    again = ashd(server, "queue", "cancel", first, ok=False)
    assert again.returncode == 1 and "only pending items can be cancelled" in again.stderr

    stats = json.loads(ashd(server, "queue", "stats", "--json").stdout)
    assert stats == {"pending": 1, "processing": 0, "completed": 0, "failed": 0, "cancelled": 1}
    assert "cancelled" in ashd(server, "queue", "stats").stdout
    assert json.loads(ashd(server, "queue", "list", "--status", "cancelled", "--json").stdout)[0]["id"] == first

    third = ashd(server, "queue", "add", "helper", "one more")
    full = ashd(server, "queue", "add", "helper", "one too many", ok=False)
    assert full.returncode == 1 and "SERVICE_TENANT_MAX_QUEUED" in full.stderr and "409" in full.stderr
    ashd(server, "queue", "cancel", third.stdout.strip())

    missing = ashd(server, "queue", "add", "nobody", "x", ok=False)
    assert missing.returncode == 1 and "Agent nobody not found" in missing.stderr
    gone = ashd(server, "queue", "show", "0f0e0d0c-0000-4000-8000-000000000000", ok=False)
    assert gone.returncode == 1 and "not found" in gone.stderr
