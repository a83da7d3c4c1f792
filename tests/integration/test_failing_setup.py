"""An agent whose setup.sh fails: POST /api/sessions answers 500 with the step, its exit status, the
tail of its output and the id of the session it left in `error`, whose stored events and logs keep the output."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401  (fixture)
from tests.integration.test_sessions import sapi  # noqa: F401  (fixture)

pytestmark = pytest.mark.sandbox


async def test_a_failing_setup_names_the_session_and_shows_the_output(sapi: Api) -> None:  # noqa: F811
    files: list[dict[str, Any]] = [
        {"path": "AGENT.md", "content": "You fail to set up."},
        {"path": "setup.sh", "content": "echo building step one\necho building step two\necho oh no >&2\nexit 3\n"},
    ]
    status, body = await sapi.call("POST", "/api/agents", json={"name": "failing", "files": files})
    assert status == 201, body
    status, body = await sapi.call("POST", "/api/sessions", json={"agent": "failing"})
    assert status == 500, body
    error = body["error"]
    assert "setup.sh failed (exit 3)" in error and "building step two" in error and "oh no" in error
    found = re.search(r"session ([0-9a-f-]{36}) is left `error`", error)
    assert found, error
    sid = found.group(1)
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert status == 200 and body["session"]["status"] == "error"
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/events")
    assert status == 200
    assert any("building step one" in (e["data"] or "") for e in body["events"]), body
    # Each line is its own `setup` lifecycle event, with the stream it was printed on.
    setup = [json.loads(e["data"]) for e in body["events"] if e["type"] == "lifecycle"]
    lines = [(d["level"], d["text"]) for d in setup if d["action"] == "setup"]
    assert ("stdout", "building step two") in lines and ("stderr", "oh no") in lines
    assert lines[-1] == ("system", lines[-1][1]) and "setup.sh failed (exit 3)" in lines[-1][1]
    assert setup[-1]["action"] == "error"
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/logs")
    assert status == 200 and body["source"] == "stored"
    assert [(x["level"], x["text"]) for x in body["logs"] if x["source"] == "setup"] == lines
