"""Agents API through real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any

from ashd.config import Settings
from tests.conftest import Api, start_api


def make_agent_dir(root: Path, prompt: str = "You are a test agent.") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "AGENT.md").write_text(prompt)
    (root / ".agent").mkdir(exist_ok=True)
    (root / ".agent" / "settings.json").write_text('{"permissions": {"allow": ["Bash"]}}')
    return root


def data_dir(api: Api) -> Path:
    assert api.server.components is not None
    return api.server.components.settings.data_path


async def test_deploy_from_path_get_list_delete(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "agent-a")
    status, body = await api.call("POST", "/api/agents", json={"name": "agent-a", "path": str(folder)})
    assert status == 201, body
    agent = body["agent"]
    assert agent["name"] == "agent-a"
    assert agent["version"] == 1
    assert agent["tenantId"] == "default"
    assert agent["path"] == str(folder.resolve())
    assert agent["model"] is None
    assert agent["env"] == {}
    for field in ("id", "createdAt", "updatedAt"):
        assert agent[field]

    status, body = await api.call("GET", "/api/agents/agent-a")
    assert status == 200
    assert body["agent"]["id"] == agent["id"]
    status, body = await api.call("GET", "/api/agents")
    assert status == 200
    assert [a["name"] for a in body["agents"]] == ["agent-a"]

    status, body = await api.call("DELETE", "/api/agents/agent-a")
    assert status == 200
    assert body == {"ok": True}
    assert folder.joinpath("AGENT.md").exists()  # a client's folder is never removed
    status, body = await api.call("GET", "/api/agents/agent-a")
    assert status == 404
    assert body == {"error": "Agent agent-a not found", "statusCode": 404}
    status, body = await api.call("DELETE", "/api/agents/agent-a")
    assert status == 404
    assert body["statusCode"] == 404


async def test_relative_path_resolves_against_data_dir(api: Api) -> None:
    make_agent_dir(data_dir(api) / "library" / "rel-agent")
    status, body = await api.call("POST", "/api/agents", json={"name": "rel", "path": "library/rel-agent"})
    assert status == 201, body
    assert body["agent"]["path"] == str(data_dir(api) / "library" / "rel-agent")


async def test_upsert_increments_version_and_keeps_id(api: Api, tmp_path: Path) -> None:
    one = make_agent_dir(tmp_path / "one")
    two = make_agent_dir(tmp_path / "two")
    _, first = await api.call("POST", "/api/agents", json={"name": "up", "path": str(one)})
    status, second = await api.call("POST", "/api/agents", json={"name": "up", "path": str(two)})
    assert status == 201
    assert second["agent"]["version"] == 2
    assert second["agent"]["id"] == first["agent"]["id"]
    assert second["agent"]["path"] == str(two.resolve())


async def test_concurrent_deploys_lose_no_version(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "c")
    results = await asyncio.gather(*[
        api.call("POST", "/api/agents", json={"name": "conc", "path": str(folder)}) for _ in range(6)
    ])
    assert all(status == 201 for status, _ in results), results
    assert sorted(body["agent"]["version"] for _, body in results) == [1, 2, 3, 4, 5, 6]
    _, body = await api.call("GET", "/api/agents/conc")
    assert body["agent"]["version"] == 6


async def test_deploy_from_files_and_system_prompt(api: Api) -> None:
    png = bytes(range(256))
    status, body = await api.call("POST", "/api/agents", json={
        "name": "uploaded", "systemPrompt": "Be brief.",
        "files": [
            {"path": ".agent/settings.json", "content": '{"model": "claude-x"}'},
            {"path": "assets/logo.png", "content": base64.b64encode(png).decode(), "encoding": "base64"},
            {"path": "docs/ünïcode name.txt", "content": "héllo"},
        ],
    })
    assert status == 201, body
    path = Path(body["agent"]["path"])
    tenant_dir = data_dir(api) / "agents" / "default" / "uploaded"
    assert path == tenant_dir / "v1"
    assert (path / "AGENT.md").read_text() == "Be brief."
    assert (path / "assets" / "logo.png").read_bytes() == png

    status, body = await api.call("GET", "/api/agents/uploaded/files")
    assert status == 200
    listed = {f["path"]: f for f in body["files"]}
    assert set(listed) == {"AGENT.md", ".agent/settings.json", "assets/logo.png", "docs/ünïcode name.txt"}
    assert listed["assets/logo.png"]["size"] == 256
    assert listed["AGENT.md"]["modifiedAt"].endswith("Z")

    status, body = await api.call("GET", "/api/agents/uploaded/files/AGENT.md")
    assert status == 200
    assert body == {"path": "AGENT.md", "content": "Be brief.", "size": 9}

    resp = await api.client.get("/api/agents/uploaded/files/assets/logo.png", params={"format": "raw"},
                                headers=api.headers())
    assert resp.status == 200
    assert await resp.read() == png
    assert resp.headers["Content-Type"] == "image/png"
    assert resp.headers["Content-Length"] == "256"
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''logo.png"

    resp = await api.client.get("/api/agents/uploaded/files/docs/ünïcode name.txt", params={"format": "raw"},
                                headers=api.headers())
    assert resp.status == 200
    assert (await resp.read()).decode() == "héllo"
    assert "filename*=UTF-8''%C3%BCn%C3%AFcode%20name.txt" in resp.headers["Content-Disposition"]

    status, body = await api.call("GET", "/api/agents/uploaded/files/assets/logo.png")
    assert status == 400
    assert "binary" in body["error"]

    # a redeploy writes a new version folder; the previous one stays for sessions copying it
    status, body = await api.call("POST", "/api/agents", json={"name": "uploaded", "systemPrompt": "v2"})
    assert status == 201
    assert body["agent"]["version"] == 2
    assert Path(body["agent"]["path"]) == tenant_dir / "v2"
    assert (tenant_dir / "v1" / "AGENT.md").read_text() == "Be brief."
    await api.call("POST", "/api/agents", json={"name": "uploaded", "systemPrompt": "v3"})
    assert not (tenant_dir / "v1").exists()
    assert (tenant_dir / "v2").exists()

    status, _ = await api.call("DELETE", "/api/agents/uploaded")
    assert status == 200
    assert not tenant_dir.exists()


async def test_agent_md_as_file_entry(api: Api) -> None:
    status, body = await api.call("POST", "/api/agents", json={
        "name": "filesonly", "files": [{"path": "AGENT.md", "content": "from files"}]})
    assert status == 201, body
    assert (Path(body["agent"]["path"]) / "AGENT.md").read_text() == "from files"


async def test_deploy_errors(api: Api, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    good = make_agent_dir(tmp_path / "good")
    cases: list[tuple[object, str]] = [
        ({"path": str(good)}, "`name` is required"),
        ({"name": "x"}, "`path` is required"),
        ({"name": "bad name!", "path": str(good)}, "invalid"),
        ({"name": "a" * 256, "path": str(good)}, "longer than 255"),
        ({"name": "x", "path": str(empty)}, "lacks AGENT.md"),
        ({"name": "x", "path": str(tmp_path / "missing")}, "not a readable directory"),
        ({"name": "x", "path": "/"}, "data directory"),
        ({"name": "x", "path": "agents"}, "data directory"),
        ({"name": "x", "path": str(good), "systemPrompt": "p"}, "not both"),
        ({"name": "x", "files": [{"path": "README.md", "content": "no prompt"}]}, "no AGENT.md"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "../escape", "content": "x"}]}, "'..'"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "/etc/passwd", "content": "x"}]}, "absolute"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "a\u0000b", "content": "x"}]}, "NUL"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "a", "content": "1"},
                                                       {"path": "a/b", "content": "2"}]}, "both a file"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "a", "content": "!!", "encoding": "base64"}]},
         "base64"),
        ({"name": "x", "systemPrompt": "p", "files": "nope"}, "`files` must be an array"),
        ({"name": "x", "systemPrompt": "p", "env": {"1BAD": "v"}}, "environment variable name"),
        ({"name": "x", "systemPrompt": "p", "env": {"A": 1}}, "string values"),
        ({"name": "x", "systemPrompt": "p", "files": [{"path": "AGENT.md", "content": "q"}]}, "not both"),
        ([1, 2], "JSON object"),
    ]
    for payload, fragment in cases:
        status, body = await api.call("POST", "/api/agents", json=payload)
        assert status == 400, (payload, body)
        assert body["statusCode"] == 400, (payload, body)
        assert fragment in body["error"], (payload, body)
    status, body = await api.call("GET", "/api/agents")
    assert body == {"agents": []}


async def test_another_tenants_agent_is_404(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "mine")
    await api.call("POST", "/api/agents", json={"name": "mine", "path": str(folder)})
    other = await api.new_tenant_key("acme")
    for method, path in [("GET", "/api/agents/mine"), ("DELETE", "/api/agents/mine"),
                         ("GET", "/api/agents/mine/files"), ("GET", "/api/agents/mine/files/AGENT.md")]:
        status, body = await api.call(method, path, key=other)
        assert (status, body["statusCode"]) == (404, 404), (method, path)
    status, body = await api.call("PATCH", "/api/agents/mine", key=other, json={"model": "m"})
    assert status == 404
    status, body = await api.call("GET", "/api/agents", key=other)
    assert body == {"agents": []}
    # the same name in another tenant is a different agent
    status, body = await api.call("POST", "/api/agents", key=other,
                                  json={"name": "mine", "systemPrompt": "hi"})
    assert status == 201
    assert body["agent"]["version"] == 1
    assert body["agent"]["tenantId"] == "acme"
    _, mine = await api.call("GET", "/api/agents/mine")
    assert mine["agent"]["path"] == str(folder.resolve())


async def test_patch_masks_env_and_keeps_version(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "p")
    await api.call("POST", "/api/agents",
                   json={"name": "p", "path": str(folder), "env": {"TOKEN": "s3cret-v"}})
    status, body = await api.call("PATCH", "/api/agents/p",
                                  json={"model": "claude-test", "env": {"API": "zzz-9"}})
    assert status == 200, body
    agent = body["agent"]
    assert agent["model"] == "claude-test"
    assert agent["env"] == {"API": "***"}
    assert agent["version"] == 1
    assert "zzz-9" not in str(body)
    _, got = await api.call("GET", "/api/agents/p")
    assert got["agent"]["env"] == {"API": "***"}

    services = api.server.components
    assert services is not None
    view = await services.agents.resolve("default", "p")
    assert dict(view.env) == {"API": "zzz-9"}
    assert view.model == "claude-test"
    assert view.version == 1
    assert "zzz-9" not in repr(view)

    from sqlalchemy import select

    from ashd.storage import Agent

    async with services.db.read() as s:
        blob = (await s.execute(select(Agent.env_ciphertext).where(Agent.name == "p"))).scalar_one()
    assert blob is not None
    assert b"zzz-9" not in blob

    status, body = await api.call("PATCH", "/api/agents/p", json={"model": None})
    assert status == 200
    assert body["agent"]["model"] is None
    assert body["agent"]["env"] == {"API": "***"}
    status, body = await api.call("PATCH", "/api/agents/p", json={})
    assert status == 400
    assert "nothing to update" in body["error"]
    status, body = await api.call("PATCH", "/api/agents/p", json={"env": {"bad name": "x"}})
    assert status == 400
    status, body = await api.call("PATCH", "/api/agents/nope", json={"model": "m"})
    assert status == 404
    assert body["error"] == "Agent nope not found"


async def test_file_reads_refuse_traversal_and_symlink_escapes(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "s")
    secret = tmp_path / "outside.txt"
    secret.write_text("host secret")
    os.symlink(secret, folder / "leak.txt")
    os.symlink(tmp_path, folder / "updir")
    (folder / "sub").mkdir()
    (folder / "inside.txt").write_text("ok")
    os.symlink(folder / "inside.txt", folder / "alias.txt")
    await api.call("POST", "/api/agents", json={"name": "s", "path": str(folder)})

    status, body = await api.call("GET", "/api/agents/s/files")
    paths = {f["path"] for f in body["files"]}
    assert "leak.txt" not in paths
    assert not any(p.startswith("updir") for p in paths)
    assert {"inside.txt", "alias.txt", "AGENT.md"} <= paths

    for rel in ("leak.txt", "updir/outside.txt", "missing.txt"):
        for fmt in ("json", "raw"):
            status, body = await api.call("GET", f"/api/agents/s/files/{rel}", params={"format": fmt})
            assert (status, body["statusCode"]) == (404, 404), (rel, fmt, body)
            assert "host secret" not in str(body)
    for rel in ("..%2Foutside.txt", "sub/..%2F..%2Foutside.txt", "%2Fetc%2Fpasswd", "sub"):
        status, body = await api.call("GET", f"/api/agents/s/files/{rel}")
        assert (status, body["statusCode"]) == (400, 400), (rel, body)
    status, body = await api.call("GET", "/api/agents/s/files/alias.txt")
    assert status == 200
    assert body["content"] == "ok"
    status, body = await api.call("GET", "/api/agents/s/files/inside.txt", params={"format": "xml"})
    assert status == 400
    assert "format" in body["error"]
    status, body = await api.call("GET", "/api/agents/none/files")
    assert status == 404


async def test_json_read_size_limit(api: Api, tmp_path: Path) -> None:
    folder = make_agent_dir(tmp_path / "big")
    (folder / "big.txt").write_bytes(b"a" * (1024 * 1024 + 1))
    await api.call("POST", "/api/agents", json={"name": "big", "path": str(folder)})
    status, body = await api.call("GET", "/api/agents/big/files/big.txt")
    assert status == 400
    assert "format=raw" in body["error"]
    resp = await api.client.get("/api/agents/big/files/big.txt?format=raw", headers=api.headers())
    assert resp.status == 200
    assert len(await resp.read()) == 1024 * 1024 + 1


async def test_concurrent_managed_deploys_each_get_their_folder(api: Api) -> None:
    results = await asyncio.gather(*[
        api.call("POST", "/api/agents", json={"name": "mc", "systemPrompt": f"prompt {i}"}) for i in range(4)
    ])
    assert all(status == 201 for status, _ in results), results
    by_version = {body["agent"]["version"]: Path(body["agent"]["path"]) for _, body in results}
    assert sorted(by_version) == [1, 2, 3, 4]
    assert by_version[4].name == "v4"
    assert (by_version[4] / "AGENT.md").read_text().startswith("prompt ")
    base = by_version[4].parent
    assert not [p for p in base.iterdir() if p.name.startswith(".staging")]


async def test_delete_after_switching_from_managed_to_path_removes_managed_folders(
    api: Api, tmp_path: Path,
) -> None:
    _, body = await api.call("POST", "/api/agents", json={"name": "sw", "systemPrompt": "managed"})
    managed = Path(body["agent"]["path"])
    folder = make_agent_dir(tmp_path / "sw")
    status, body = await api.call("POST", "/api/agents", json={"name": "sw", "path": str(folder)})
    assert status == 201
    assert body["agent"]["version"] == 2
    status, _ = await api.call("DELETE", "/api/agents/sw")
    assert status == 200
    assert not managed.parent.exists()
    assert (folder / "AGENT.md").exists()


async def test_agent_roots_restrict_path_deploys(aiohttp_client: Any, settings: Settings, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed" / "bot"
    outside = tmp_path / "outside" / "bot"
    for folder in (allowed, outside):
        folder.mkdir(parents=True)
        (folder / "AGENT.md").write_text("hi")
    server, api = await start_api(aiohttp_client, settings.with_(agent_roots=str(tmp_path / "allowed")))
    try:
        status, body = await api.call("POST", "/api/agents", json={"name": "ok", "path": str(allowed)})
        assert status == 201, body
        status, body = await api.call("POST", "/api/agents", json={"name": "no", "path": str(outside)})
        assert status == 400 and "SERVICE_AGENT_ROOTS" in body["error"]
    finally:
        await api.client.close()
        await server.stop()
