"""Clients written for the reference implementation keep working against ashd. Each test does what
a published reference client sends and checks what that client expects:

- its CLI (`ash session send`) reads the stream by splitting on "\\n" and matching `event: <name>`;
- its session-restore suite resumes a paused session whose agent was deleted and expects 404, while
  messages to a still-active session keep working (agents rule 2);
- its CLI (`ash deploy`) uploads every file of the agent folder base64-encoded with no `encoding`
  field (`collectFiles` in packages/cli/src/commands/deploy.ts), and its SDKs pass `files` through
  as the caller gives them (base64, as that server decodes them); plain-text uploads still work;
- its key list shows only a short prefix of a key.
Adapted only for the renamed prompt file (AGENT.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from ash_sdk.api.agents import post_api_agents  # type: ignore[import-untyped]
from ash_sdk.client import AuthenticatedClient  # type: ignore[import-untyped]
from ash_sdk.models.post_api_agents_body import PostApiAgentsBody  # type: ignore[import-untyped]
from ash_sdk.models.post_api_agents_body_files_item import PostApiAgentsBodyFilesItem  # type: ignore[import-untyped]

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox


def cli_read_stream(raw: str) -> list[tuple[str, str]]:
    """The reference CLI's stream reader (`ash session send`): lines split on "\\n", `event: ` sets
    the current event, `data: ` is handed to it."""
    out, current = [], ""
    for line in raw.split("\n"):
        if line.startswith("event: "):
            current = line[7:]
        elif line.startswith("data: "):
            out.append((current, line[6:]))
    return out


async def test_stream_lines_end_in_lf_as_the_reference_cli_splits_them(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    resp = await sapi.client.post(f"/api/sessions/{sid}/messages", json={"content": "hello"}, headers=sapi.headers())
    raw = (await resp.read()).decode()
    assert "\r" not in raw
    events = cli_read_stream(raw)
    assert {name for name, _ in events} == {"message", "done"}
    assert events[-1][0] == "done" and json.loads(events[-1][1]) == {"sessionId": sid}

    replay = await sapi.client.get(f"/api/sessions/{sid}/stream?after=0", headers=sapi.headers())
    raw = (await replay.read()).decode()
    assert "\r" not in raw and cli_read_stream(raw)[-1][0] == "done"


async def test_resume_after_the_agent_was_deleted_is_404_but_an_active_session_keeps_working(
    sapi: Api, tmp_path: Path,  # noqa: F811
) -> None:
    folder = tmp_path / "restore-agent"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You restore.")
    status, _ = await sapi.call("POST", "/api/agents", json={"name": "temp-agent", "path": str(folder)})
    assert status == 201
    paused = (await create(sapi, agent="temp-agent"))["id"]
    stopped = (await create(sapi, agent="temp-agent"))["id"]
    active = (await create(sapi, agent="temp-agent"))["id"]
    assert (await sapi.call("POST", f"/api/sessions/{paused}/pause"))[0] == 200
    assert (await sapi.call("POST", f"/api/sessions/{stopped}/stop"))[0] == 200

    assert (await sapi.call("DELETE", "/api/agents/temp-agent"))[0] == 200

    for sid in (paused, stopped):  # the warm path and the cold path
        status, body = await sapi.call("POST", f"/api/sessions/{sid}/resume")
        assert status == 404, body
        assert body == {"error": "Agent temp-agent not found", "statusCode": 404}
        assert (await sapi.call("GET", f"/api/sessions/{sid}"))[1]["session"]["status"] in ("paused", "stopped")
    status, frames = await send(sapi, active, "still there?")
    assert status == 200 and frames[-1].event == "done"
    assert not [f for f in frames if f.event == "error"]
    status, body = await sapi.call("POST", f"/api/sessions/{active}/resume")  # active: a no-op, as before
    assert status == 200 and body["session"]["status"] == "active"


def cli_collect_files(folder: Path) -> list[dict[str, str]]:
    """`collectFiles` of the reference CLI: every file, relative path, base64 content, no encoding."""
    skip = {"node_modules", ".git", "__pycache__", ".cache", ".npm", ".pnpm-store", ".yarn", ".venv", "venv",
            ".tmp", "tmp", ".DS_Store"}
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in names:
            if name in skip or name.endswith((".env", ".env.local", ".sock", ".lock", ".pid")):
                continue
            path = Path(root, name)
            files.append({"path": str(path.relative_to(folder)), "content": base64.b64encode(path.read_bytes()).decode()})
    return files


def agent_folder(root: Path) -> dict[str, bytes]:
    content = {
        "AGENT.md": b"You are the deployed agent.\nBe brief.\n",
        ".agent/settings.json": b'{"permissions": {"allow": ["Read"]}}\n',
        ".agent/skills/greet.md": "Greet $ARGUMENTS — warmly.\n".encode(),
        "scripts/run.sh": b"#!/bin/sh\necho hi\n",
        "assets/logo.png": bytes(range(256)),
        "data/TODO": b"Test",  # a one-word file: its base64 looks like text, its text like base64
    }
    for rel, data in content.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return content


async def deployed_files(api: Api, name: str) -> dict[str, bytes]:
    status, body = await api.call("GET", f"/api/agents/{name}/files")
    assert status == 200, body
    out = {}
    for entry in body["files"]:
        resp = await api.client.get(f"/api/agents/{name}/files/{entry['path']}", params={"format": "raw"},
                                    headers=api.headers())
        out[entry["path"]] = await resp.read()
    return out


async def test_a_cli_deploy_of_base64_files_without_encoding_gives_the_files_it_meant(
    sapi: Api, tmp_path: Path, fake_model: FakeModel,  # noqa: F811
) -> None:
    content = agent_folder(tmp_path / "my-agent")
    body = {"name": "my-agent", "files": cli_collect_files(tmp_path / "my-agent"), "env": {"GREETING": "hi"}}
    status, resp = await sapi.call("POST", "/api/agents", json=body)
    assert status == 201, resp
    assert await deployed_files(sapi, "my-agent") == content
    # and a session of it works with that prompt
    sid = (await create(sapi, agent="my-agent"))["id"]
    status, frames = await send(sapi, sid, "who are you?")
    assert status == 200 and frames[-1].event == "done"
    system = fake_model.requests_containing("who are you?")[0]["body"]["system"]
    assert "You are the deployed agent." in str(system)


async def test_the_published_python_sdk_deploys_base64_files(sapi: Api) -> None:  # noqa: F811
    client = AuthenticatedClient(base_url=str(sapi.client.make_url("")).rstrip("/"), token=sapi.key)
    files = [PostApiAgentsBodyFilesItem(path="AGENT.md", content=base64.b64encode(b"SDK prompt").decode()),
             PostApiAgentsBodyFilesItem(path="bin/blob", content=base64.b64encode(b"\x00\xff\x10").decode())]
    resp = await asyncio.to_thread(post_api_agents.sync_detailed, client=client,
                                   body=PostApiAgentsBody(name="sdk-files", files=files))
    assert resp.status_code == 201, resp.content
    assert await deployed_files(sapi, "sdk-files") == {"AGENT.md": b"SDK prompt", "bin/blob": b"\x00\xff\x10"}


@pytest.mark.parametrize(("files", "expected"), [
    # ashd's own plain-text uploads are unchanged, including text that is also valid base64
    ([{"path": "AGENT.md", "content": "Test"}], {"AGENT.md": b"Test"}),
    ([{"path": "AGENT.md", "content": "You are helpful."}, {"path": "abcd", "content": "abcd"}],
     {"AGENT.md": b"You are helpful.", "abcd": b"abcd"}),
    # an explicit encoding on any file means no guessing for the others
    ([{"path": "AGENT.md", "content": "QUJD", "encoding": "utf-8"}, {"path": "b", "content": "QUJD"}],
     {"AGENT.md": b"QUJD", "b": b"QUJD"}),
    ([{"path": "AGENT.md", "content": "p"}, {"path": "b", "content": "QUJD", "encoding": "base64"}],
     {"AGENT.md": b"p", "b": b"ABC"}),
])
async def test_plain_text_and_declared_uploads_are_kept_as_sent(
    api: Api, files: list[dict[str, str]], expected: dict[str, bytes],
) -> None:
    status, body = await api.call("POST", "/api/agents", json={"name": "plain", "files": files})
    assert status == 201, body
    assert await deployed_files(api, "plain") == expected


@pytest.fixture
async def short_key_api(aiohttp_client: Any, settings: Settings, caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.WARNING, logger="ashd._bootstrap")
    server, api = await start_api(aiohttp_client, settings.with_(api_key="abcdefg"))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def test_key_prefixes_show_a_short_part_and_never_half_and_a_short_key_is_warned_about(
    short_key_api: Api, caplog: pytest.LogCaptureFixture,
) -> None:
    api = short_key_api
    warnings = [r for r in caplog.get_records("setup") if "SERVICE_API_KEY" in r.getMessage()]
    assert warnings and "abcdefg" not in warnings[0].getMessage()
    status, minted = await api.call("POST", "/api/api-keys", json={"label": "backend"})
    assert status == 201
    status, body = await api.call("GET", "/api/api-keys")
    assert status == 200
    shown = {k["label"]: k["keyPrefix"] for k in body["keys"]}
    assert shown["SERVICE_API_KEY"] == "abc"  # 7 characters: at most 3 shown
    assert shown["backend"] == minted["key"][:8] and minted["key"].startswith(shown["backend"])
