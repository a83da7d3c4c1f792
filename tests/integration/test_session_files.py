"""Session files through real HTTP: from the live sandbox, then from the snapshot after stop/DELETE."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from ashd.devtools.fake_model import FakeModel
from ashd.sandboxing import SandboxPaths
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox

EXCLUDED = ("node_modules/pkg/index.js", ".git/config", "__pycache__/m.pyc", ".cache/c", ".npm/n", ".pnpm-store/p",
            ".yarn/y", ".venv/v", "venv/v", ".tmp/t", "tmp/t", "x.sock", "y.lock", "z.pid", "sub/node_modules/a.js")


def _workspace(api: Api, session: dict[str, Any]) -> Path:
    return SandboxPaths(Path(api.server.settings.data_dir) / "sandboxes" / str(session["sandboxId"])).workspace


def _populate(ws: Path) -> None:
    for rel in EXCLUDED:
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("excluded")
    (ws / "data").mkdir(exist_ok=True)
    (ws / "data" / "big.txt").write_text("a" * (1024 * 1024 + 10))
    (ws / "data" / "blob.bin").write_bytes(bytes(range(256)))
    (ws / "naïve name.md").write_text("# unicode name")
    os.symlink("/etc/passwd", ws / "passwd-link")
    os.symlink("/etc", ws / "etc-link")


async def _get(api: Api, sid: str, rel: str, **query: str) -> Any:
    url = URL(f"/api/sessions/{sid}/files/{rel}", encoded=True).with_query(query or None)
    return await api.client.get(url, headers=api.headers())


async def _check_files(api: Api, sid: str, source: str) -> None:
    status, body = await api.call("GET", f"/api/sessions/{sid}/files")
    assert status == 200, body
    assert body["source"] == source
    paths = {f["path"] for f in body["files"]}
    assert {"AGENT.md", "notes/out.txt", "data/big.txt", "data/blob.bin", "naïve name.md"} <= paths
    assert not paths & set(EXCLUDED)
    assert "passwd-link" not in paths and not any(p.startswith("etc-link") for p in paths)
    entry = next(f for f in body["files"] if f["path"] == "notes/out.txt")
    assert entry["size"] == len("hello from the agent") and entry["modifiedAt"]

    # raw download and its headers
    resp = await _get(api, sid, "notes/out.txt")
    assert resp.status == 200 and await resp.read() == b"hello from the agent"
    assert resp.headers["Content-Type"].startswith("text/plain")
    # exactly the interface's value: no `filename=` parameter beside `filename*`
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''out.txt"
    assert resp.headers["Content-Length"] == str(len("hello from the agent"))
    assert resp.headers["X-Service-Source"] == source
    resp = await _get(api, sid, "data/blob.bin")
    assert resp.headers["Content-Type"] == "application/octet-stream" and await resp.read() == bytes(range(256))
    resp = await _get(api, sid, "na%C3%AFve%20name.md")
    assert resp.status == 200
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''na%C3%AFve%20name.md"
    resp = await _get(api, sid, "data/big.txt")  # over the json limit, fine as raw
    assert resp.status == 200 and len(await resp.read()) == 1024 * 1024 + 10

    # format=json
    resp = await _get(api, sid, "notes/out.txt", format="json")
    assert resp.status == 200
    assert await resp.json() == {"path": "notes/out.txt", "content": "hello from the agent",
                                 "size": len("hello from the agent"), "source": source}

    # 400: too large for json, binary as json, a directory, `..`, absolute, bad format
    for rel, query in (("data/big.txt", {"format": "json"}), ("data/blob.bin", {"format": "json"}),
                       ("data", {}), ("data/..%2F..%2Fetc/passwd", {}), ("a/%2E%2E/%2E%2E/etc/passwd", {}),
                       ("%2Fetc/passwd", {}), ("notes/out.txt", {"format": "xml"})):
        resp = await _get(api, sid, rel, **query)
        body = await resp.json()
        assert resp.status == 400, (rel, query, body)
        assert body["statusCode"] == 400 and body["error"]

    # symlinks that leave the workspace are never followed; missing files are 404
    for rel in ("passwd-link", "etc-link/passwd", "missing.txt"):
        resp = await _get(api, sid, rel)
        assert resp.status in (400, 404), rel
        assert b"root:" not in await resp.read()


async def test_files_live_then_snapshot(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    fake_model.script("write-a-file", [
        {"content": [{"type": "tool_use", "name": "Write",
                      "input": {"file_path": "/workspace/notes/out.txt", "content": "hello from the agent"}}]},
        {"content": [{"type": "text", "text": "written"}]},
    ])
    sessions = []
    for _ in range(2):
        session = await create(sapi)
        status, frames = await send(sapi, session["id"], "write-a-file please")
        assert status == 200 and frames[-1].event == "done"
        tools = [b for f in frames if f.event == "message" and f.data["type"] == "assistant"
                 for b in f.data["message"]["content"] if b["type"] == "tool_use"]
        assert tools and tools[0]["name"] == "Write"
        _populate(_workspace(sapi, session))
        sessions.append(session["id"])

    await _check_files(sapi, sessions[0], "sandbox")
    status, body = await sapi.call("POST", f"/api/sessions/{sessions[0]}/pause")
    assert status == 200
    await _check_files(sapi, sessions[0], "sandbox")  # a paused session keeps its sandbox

    # after DELETE and after stop the files come from the snapshot
    status, body = await sapi.call("DELETE", f"/api/sessions/{sessions[0]}")
    assert status == 200 and body["session"]["status"] == "ended"
    status, body = await sapi.call("POST", f"/api/sessions/{sessions[1]}/stop")
    assert status == 200 and body["session"]["status"] == "stopped"
    for sid in sessions:
        await _check_files(sapi, sid, "snapshot")

    # the stopped session's files come back into a new sandbox on resume
    status, body = await sapi.call("POST", f"/api/sessions/{sessions[1]}/resume")
    assert status == 200 and body["session"]["status"] == "active"
    resp = await _get(sapi, sessions[1], "notes/out.txt")
    assert resp.headers["X-Service-Source"] == "sandbox" and await resp.read() == b"hello from the agent"
