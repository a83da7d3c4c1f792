"""A session's logs: its agent's setup output (also as lifecycle events) and its sandbox's stderr,
through `GET /api/sessions/{id}/logs`, with real sandboxes, bridges and the fake model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401  (fixture)

pytestmark = pytest.mark.sandbox

SETUP = (
    "echo first out\n"
    "echo first err >&2\n"
    "sleep 0.2\n"
    "echo second out\n"
    "printf 'no newline at the end'\n"
)


def _settings(settings: Settings, fake_model: FakeModel, **extra: Any) -> Settings:  # noqa: F811
    return settings.with_(zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test", **extra)


@pytest.fixture
async def lapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    server, api = await start_api(aiohttp_client, _settings(settings, fake_model))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def deploy(api: Api, name: str, setup: str | None, **extra: Any) -> None:
    files: list[dict[str, Any]] = [{"path": "AGENT.md", "content": "You help."}]
    if setup is not None:
        files.append({"path": "setup.sh", "content": setup})
    status, body = await api.call("POST", "/api/agents", json={"name": name, "files": files, **extra})
    assert status == 201, body


async def logs(api: Api, sid: str, query: str = "") -> dict[str, Any]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/logs{query}")
    assert status == 200, body
    return dict(body)


def setup_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    datas = [json.loads(e["data"]) for e in events if e["type"] == "lifecycle"]
    return [d for d in datas if d["action"] == "setup"]


async def test_setup_output_is_stored_as_events_and_logs(lapi: Api) -> None:
    await deploy(lapi, "chatty", SETUP)
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "chatty"})
    assert status == 201, body
    sid = body["session"]["id"]

    # Every line is stored before the creation answers: events, in order, with their stream.
    status, body = await lapi.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
    assert status == 200
    setup = setup_events(body["events"])
    printed = [(d["level"], d["text"]) for d in setup if d["level"] != "system"]
    assert printed == [("stdout", "first out"), ("stderr", "first err"), ("stdout", "second out"),
                       ("stdout", "no newline at the end")]
    assert setup[0]["level"] == "system" and setup[0]["text"] == "running sh setup.sh"
    assert setup[-1]["level"] == "system" and "setup.sh finished in" in setup[-1]["text"]
    assert all(d["step"] == "setup.sh" for d in setup)
    # The setup events come before the session's `created` event.
    actions = [json.loads(e["data"])["action"] for e in body["events"]]
    assert actions[-1] == "created" and set(actions[:-1]) == {"setup"}

    page = await logs(lapi, sid)
    assert page["source"] == "live"
    lines = [line for line in page["logs"] if line["source"] == "setup"]
    assert [(x["level"], x["text"]) for x in lines] == [(d["level"], d["text"]) for d in setup]
    indexes = [x["index"] for x in page["logs"]]
    assert indexes == list(range(len(indexes))) and indexes[0] == 0
    assert [d["index"] for d in setup] == [x["index"] for x in lines]
    assert all(x["ts"].endswith("Z") for x in page["logs"])

    # Cursor and page size.
    after = await logs(lapi, sid, "?after=1&limit=2")
    assert [x["index"] for x in after["logs"]] == [2, 3]
    # Nothing at or before the cursor (the sandbox's later lines, its bridge's own start line among
    # them, may have reached the log since the page above was read).
    newer = [x["index"] for x in (await logs(lapi, sid, f"?after={indexes[-1]}"))["logs"]]
    assert newer == list(range(indexes[-1] + 1, indexes[-1] + 1 + len(newer)))

    # Strict query checking, and tenants.
    for bad in ("?after=-2", "?limit=0", "?limit=1001", "?after=x", "?afterr=1"):
        status, body = await lapi.call("GET", f"/api/sessions/{sid}/logs{bad}")
        assert status == 400, (bad, body)
    other = await lapi.new_tenant_key("someone-else")
    status, body = await lapi.call("GET", f"/api/sessions/{sid}/logs", key=other)
    assert status == 404 and body["statusCode"] == 404

    status, _ = await lapi.call("DELETE", f"/api/sessions/{sid}")
    assert status == 200
    assert (await logs(lapi, sid))["source"] == "stored"


async def test_npm_install_then_setup_sh_in_order(lapi: Api) -> None:
    files: list[dict[str, Any]] = [
        {"path": "AGENT.md", "content": "You use node."},
        {"path": "package.json", "content": '{"name":"demo","version":"1.0.0","dependencies":{"dep":"file:./dep"}}'},
        {"path": "dep/package.json", "content": '{"name":"dep","version":"1.0.0","main":"index.js"}'},
        {"path": "dep/index.js", "content": "module.exports = 42;"},
        {"path": "setup.sh", "content": "node -e \"console.log('dep says ' + require('dep'))\"\n"},
    ]
    status, body = await lapi.call("POST", "/api/agents", json={"name": "node-agent", "files": files})
    assert status == 201, body
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "node-agent"})
    assert status == 201, body
    lines = [x for x in (await logs(lapi, body["session"]["id"]))["logs"] if x["source"] == "setup"]
    texts = [x["text"] for x in lines]
    assert texts[0] == "running npm install" and "running sh setup.sh" in texts
    npm_part = texts[:texts.index("running sh setup.sh")]
    assert any(t.startswith("npm install finished in") for t in npm_part)
    assert any("added 1 package" in t or "up to date" in t for t in npm_part), npm_part
    assert ("stdout", "dep says 42") in [(x["level"], x["text"]) for x in lines]


async def test_a_failing_setup_keeps_its_output_in_the_logs(lapi: Api) -> None:
    await deploy(lapi, "broken", "echo compiling\necho 'error: missing thing' >&2\nexit 7\n")
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "broken"})
    assert status == 500, body
    assert "setup.sh failed (exit 7)" in body["error"] and "missing thing" in body["error"]
    assert "/logs has its output" in body["error"]
    sid = body["error"].split("(session ")[1].split(" ")[0]
    page = await logs(lapi, sid)
    assert page["source"] == "stored"  # the session is left in `error`, without a sandbox
    texts = [(x["level"], x["text"]) for x in page["logs"] if x["source"] == "setup"]
    assert ("stdout", "compiling") in texts and ("stderr", "error: missing thing") in texts
    assert texts[-1][0] == "system" and "setup.sh failed (exit 7)" in texts[-1][1]
    status, body = await lapi.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
    actions = [json.loads(e["data"])["action"] for e in body["events"]]
    assert actions[-1] == "error" and "setup" in actions


async def wait_for_line(api: Api, sid: str, needle: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in (await logs(api, sid))["logs"]:
            if needle in line["text"]:
                return dict(line)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{needle!r} never reached the logs: {await logs(api, sid)}")


async def test_engine_stderr_reaches_the_logs(lapi: Api) -> None:
    await deploy(lapi, "noisy", None)
    # An MCP server is the engine's child: what it writes to stderr is the sandbox's stderr.
    servers = {"noisy": {"command": "sh", "args": ["-c", "echo engine-stderr-marker >&2; sleep 1; exit 1"]}}
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "noisy", "mcpServers": servers})
    assert status == 201, body
    sid = body["session"]["id"]
    line = await wait_for_line(lapi, sid, "engine-stderr-marker")
    assert line["level"] == "stderr" and line["source"] == "sandbox"
    # The engine's own report of the failed server is in the sandbox's stderr too.
    await wait_for_line(lapi, sid, "noisy")
    # No setup ran: no setup lines, no setup events.
    page = await logs(lapi, sid)
    assert all(x["source"] == "sandbox" for x in page["logs"])


async def test_the_bridges_own_log_lines_reach_the_logs(aiohttp_client: Any, settings: Settings,
                                                       fake_model: FakeModel) -> None:  # noqa: F811
    # The fork server builds the bridge's log handler once (`zygote_warm`); each child's lines must
    # still go to its own sandbox's log, in the bridge's format, and not to the fork server's. No
    # spares: a session's log starts where it claimed its sandbox, after a spare's first line.
    server, api = await start_api(aiohttp_client, _settings(settings, fake_model, prewarm=0))
    try:
        await deploy(api, "plain", None)
        sids = []
        for _ in range(2):
            status, body = await api.call("POST", "/api/sessions", json={"agent": "plain"})
            assert status == 201, body
            sids.append(body["session"]["id"])
        for sid in sids:
            line = await wait_for_line(api, sid, "bridge listening on")
            assert line["source"] == "sandbox"
            assert " bridge INFO ashd.bridge._server: bridge listening on /run/ashd/bridge.sock (pid 1, inherited)" \
                in line["text"], line
            texts = [x["text"] for x in (await logs(api, sid))["logs"]]
            assert sum("bridge listening on" in t for t in texts) == 1, texts
    finally:
        await api.client.close()
        await server.stop()


async def test_a_stopped_sessions_sandbox_lines_are_kept(lapi: Api) -> None:
    await deploy(lapi, "quick", None)
    servers = {"late": {"command": "sh", "args": ["-c", "sleep 0.3; echo written-before-the-stop >&2; exit 1"]}}
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "quick", "mcpServers": servers})
    assert status == 201, body
    sid = body["session"]["id"]
    # The engine starts its MCP servers after the create's answer, and a query waits for them: once
    # a turn is done the server has written its line (and failed), likely before the log's tail read
    # it (once a second). The stop, at once, stores what is left.
    status, stream = await lapi.call("POST", f"/api/sessions/{sid}/messages", json={"content": "go"})
    assert status == 200 and "event: done" in stream, stream
    status, _ = await lapi.call("POST", f"/api/sessions/{sid}/stop")
    assert status == 200
    page = await logs(lapi, sid)
    assert page["source"] == "stored"
    assert any("written-before-the-stop" in x["text"] for x in page["logs"]), page


async def test_limits_and_restart(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> None:  # noqa: F811
    limited = _settings(settings, fake_model, setup_log_lines=5, session_log_lines=4)
    server, api = await start_api(aiohttp_client, limited)
    long_line = "x" * 5000
    try:
        await deploy(api, "flood", f"echo {long_line} >&2\nsleep 0.3\nfor i in $(seq 1 50); do echo line-$i; done\n")
        status, body = await api.call("POST", "/api/sessions", json={"agent": "flood"})
        assert status == 201, body
        sid = body["session"]["id"]
        status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
        setup = setup_events(body["events"])
        printed = [d["text"] for d in setup if d["level"] != "system"]
        # The bridge sends at most 5 lines of output; the server would cut the same way.
        assert printed[1:] == ["line-1", "line-2", "line-3"]
        assert printed[0] == "x" * 4000 + " … [line cut: 1000 more characters]"
        notes = [d["text"] for d in setup if d["level"] == "system"]
        assert any("47 more lines not shown" in n for n in notes), notes
        # A session keeps its newest 4 lines: the oldest indexes are gone.
        page = await logs(api, sid)
        assert len(page["logs"]) == 4
        newest = page["logs"][-1]["index"]
        assert [x["index"] for x in page["logs"]] == list(range(newest - 3, newest + 1))
        assert newest + 1 >= len(setup)
    finally:
        await api.client.close()
        await server.stop()

    # A restart: the lines are stored, so they are all still there.
    server, api = await start_api(aiohttp_client, limited)
    try:
        again = await logs(api, sid)
        # The newest 4 as of the stop (which stores the sandbox's last lines) are all there.
        assert len(again["logs"]) == 4 and again["logs"][-1]["index"] >= newest
        assert again["source"] == "stored"  # paused at the restart: no sandbox
        status, body = await api.call("GET", f"/api/sessions/{sid}/events?type=lifecycle")
        assert [d["text"] for d in setup_events(body["events"])] == [d["text"] for d in setup]
    finally:
        await api.client.close()
        await server.stop()


async def test_long_setup_lines_are_cut(lapi: Api) -> None:
    await deploy(lapi, "wide", "python3 -c \"print('y' * 20000)\"\necho after\n")
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "wide"})
    assert status == 201, body
    sid = body["session"]["id"]
    lines = [x for x in (await logs(lapi, sid))["logs"] if x["source"] == "setup" and x["level"] == "stdout"]
    assert lines[0]["text"].startswith("y" * 4000) and "line cut: 16000 more characters" in lines[0]["text"]
    assert lines[1]["text"] == "after"


async def test_the_published_client_parses_the_logs(lapi: Api) -> None:
    from ash_sdk import AuthenticatedClient  # type: ignore[import-untyped]
    from ash_sdk.api.sessions import get_api_sessions_id_logs  # type: ignore[import-untyped]
    from ash_sdk.models.get_api_sessions_id_logs_response_200 import (  # type: ignore[import-untyped]
        GetApiSessionsIdLogsResponse200,
    )

    await deploy(lapi, "sdk-logs", "echo from the sdk agent\necho warn >&2\n")
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "sdk-logs"})
    assert status == 201, body
    sid = body["session"]["id"]
    base = str(lapi.client.make_url("")).rstrip("/")

    def fetch(after: int | None = None) -> Any:
        with AuthenticatedClient(base_url=base, token=lapi.key, raise_on_unexpected_status=True) as c:
            if after is None:
                return get_api_sessions_id_logs.sync(sid, client=c)
            return get_api_sessions_id_logs.sync(sid, client=c, after=after)

    parsed = await asyncio.to_thread(fetch)
    assert isinstance(parsed, GetApiSessionsIdLogsResponse200)
    assert parsed.source == "live"
    texts = [(item.level, item.text) for item in parsed.logs]
    assert ("stdout", "from the sdk agent") in texts and ("stderr", "warn") in texts
    assert parsed.logs[0].index == 0 and parsed.logs[0].ts
    later = await asyncio.to_thread(fetch, 1)
    # The lines after index 1 as the first read had them, then any the sandbox wrote since (its
    # bridge's own start line reaches the log when the tail next reads the file: a CI run once read
    # it between the two calls).
    indexes = [item.index for item in later.logs]
    assert indexes[:len(parsed.logs) - 2] == [item.index for item in parsed.logs[2:]]
    assert indexes == list(range(2, 2 + len(indexes)))


_LAST_WORDS = (
    "import sys\n"
    "sys.stderr.write('last-words-of-the-sandbox\\n'); sys.stderr.flush()\n"
)
TALKING_MCP = (Path(__file__).resolve().parent.parent / "fixtures" / "mcp_echo_server.py").read_text().replace(
    'if __name__ == "__main__":', _LAST_WORDS + 'if __name__ == "__main__":')


def _parent_of(cmdline_part: str) -> int:
    """The host pid of the parent of the one process whose command line holds `cmdline_part`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if cmdline_part in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    status = Path(f"/proc/{entry}/status").read_text()
                    found.append(int(status.split("PPid:")[1].split()[0]))
    assert len(found) == 1, found
    return found[0]


async def test_a_crashed_sandbox_leaves_its_last_lines(lapi: Api) -> None:
    # An MCP server (the engine's child, on the bridge's stderr) writes a line; then the bridge dies
    # as a crash or an OOM kill would end it: the sandbox goes, and its last line is read from the
    # file after its directory went. The bridge is killed from the host: code in the sandbox cannot
    # signal it (on the zygote route it is the pid 1 of the sandbox's pid namespace).
    server = f"talking-{uuid.uuid4().hex[:8]}.py"
    files = [{"path": "AGENT.md", "content": "You crash."}, {"path": server, "content": TALKING_MCP},
             {"path": ".mcp.json", "content": json.dumps(
                 {"mcpServers": {"talking": {"command": sys.executable, "args": [f"/workspace/{server}"]}}})}]
    status, body = await lapi.call("POST", "/api/agents", json={"name": "crashing", "files": files})
    assert status == 201, body
    status, body = await lapi.call("POST", "/api/sessions", json={"agent": "crashing"})
    assert status == 201, body
    sid = body["session"]["id"]
    await wait_for_line(lapi, sid, "last-words-of-the-sandbox", timeout=30)
    os.kill(_parent_of(f"/workspace/{server}"), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (await lapi.call("GET", f"/api/sessions/{sid}"))[1]["session"]["status"] != "paused":
        assert time.monotonic() < deadline, "the lost sandbox never paused its session"
        await asyncio.sleep(0.1)
    line = await wait_for_line(lapi, sid, "last-words-of-the-sandbox", timeout=10)
    assert line["level"] == "stderr" and line["source"] == "sandbox"
