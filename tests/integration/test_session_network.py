"""Through the product: an agent in a session with `network: true` turns its Bash tool on the
server that hosts it (its HTTP port, the internal endpoints) and on PostgreSQL, and gets nowhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sandbox_network import PG_HOST, PG_PORT, require_network
from tests.integration.test_sessions import create, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox

PROBE = (Path(__file__).parents[1] / "fixtures" / "netprobe.py").read_text()


async def test_a_networked_session_cannot_reach_its_server_or_postgres(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    require_network()
    status, body = await sapi.call("POST", "/api/agents", json={
        "name": "helper", "systemPrompt": "You probe.", "network": True,
        "files": [{"path": "netprobe.py", "content": PROBE}]})
    assert status == 201, body
    port = sapi.client.port
    targets = {
        "http": {"server": ["127.0.0.1", port], "server via gateway": ["gateway", port]},
        "pg": {"postgres": [PG_HOST, PG_PORT], "postgres via gateway": ["gateway", PG_PORT]},
    }
    fake_model.script("netprobe-tok", [
        {"content": [{"type": "tool_use", "name": "Bash",
                      "input": {"command": f"python -I netprobe.py '{json.dumps(targets)}'"}}]},
        {"content": [{"type": "text", "text": "probed"}]},
    ])
    session = await create(sapi)
    status, frames = await send(sapi, session["id"], "netprobe-tok")
    assert status == 200, frames
    results = [b for f in frames if f.event == "message" and f.data["type"] == "user"
               for b in f.data["message"]["content"] if b["type"] == "tool_result"]
    assert len(results) == 1, frames
    content: Any = results[0]["content"]
    output = content if isinstance(content, str) else "".join(c.get("text", "") for c in content)
    probe = json.loads(output.strip().splitlines()[-1])
    reached = {name: r["detail"] for name, r in probe["results"].items() if r["reached"]}
    assert reached == {}
    assert probe["routes"], "the session's sandbox has a network (a default route), just not the host's"
