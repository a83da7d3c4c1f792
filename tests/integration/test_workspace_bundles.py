"""GET and POST /api/sessions/{id}/workspace through a real server and real sandboxes: a bundle of
the live workspace (or of the latest snapshot once the sandbox is gone) and a client's bundle
restored into the live workspace under the snapshot rules, owned by the sandbox user."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest

from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _exec(api: Api, sid: str, command: str) -> str:
    status, body = await api.call("POST", f"/api/sessions/{sid}/exec", json={"command": command})
    assert status == 200, body
    return str(body["stdout"])


async def _download(api: Api, sid: str) -> tuple[str, dict[str, bytes]]:
    resp = await api.client.get(f"/api/sessions/{sid}/workspace", headers=api.headers())
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"] == "application/gzip"
    assert resp.headers["Content-Disposition"] == f"attachment; filename*=UTF-8''workspace-{sid}.tar.gz"
    data = await resp.read()
    assert resp.headers["Content-Length"] == str(len(data))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}  # type: ignore[union-attr]
    return resp.headers["X-Service-Source"], files


def _bundle(entries: list[tuple[tarfile.TarInfo, bytes]]) -> str:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tf:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return base64.b64encode(raw.getvalue()).decode()


def _file(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


async def test_download_from_the_live_sandbox_then_from_the_snapshot(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    await _exec(sapi, sid, "mkdir -p out && echo result > out/r.txt && mkdir -p node_modules/x && "
                           "echo dep > node_modules/x/i.js")
    source, files = await _download(sapi, sid)
    assert source == "sandbox"
    assert files["out/r.txt"] == b"result\n" and "AGENT.md" in files
    assert not any(name.startswith("node_modules/") for name in files)  # the interface's exclusions
    status, _ = await sapi.call("POST", f"/api/sessions/{sid}/stop")
    assert status == 200
    source, after = await _download(sapi, sid)
    assert source == "snapshot" and after["out/r.txt"] == b"result\n"


async def test_a_bundle_is_restored_for_the_agent_and_its_unsafe_entries_refused(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    link = tarfile.TarInfo("escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    up = _file("../up.txt")
    setuid = _file("bin/tool", 0o4755)
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    bundle = _bundle([(_file("src/main.py"), b"print('restored')\n"), (link, b""), (up, b"x"),
                      (setuid, b"#!/bin/sh\necho tool\n"), (fifo, b"")])
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace", json={"bundle": bundle})
    assert status == 200, body
    assert body["restored"] == 2 and len(body["skipped"]) == 3, body
    assert body["message"].startswith("restored 2 files and links")
    out = await _exec(sapi, sid, "python3 src/main.py; id -u; stat -c '%u %a' src src/main.py bin/tool; "
                                 "test -e escape || echo no-escape; test -e pipe || echo no-pipe")
    lines = out.splitlines()
    assert lines[0] == "restored"
    uid = lines[1]
    assert lines[2:5] == [f"{uid} 700", f"{uid} 644", f"{uid} 755"]  # set-uid dropped, the agent's own
    assert lines[5:] == ["no-escape", "no-pipe"]


async def test_bundle_errors(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace", json={})
    assert status == 400 and body["error"] == "`bundle` is required"
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace", json={"bundle": "not base64!"})
    assert status == 400 and "base64" in body["error"]
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace",
                                   json={"bundle": base64.b64encode(b"plain text, no tar").decode()})
    assert status == 400 and "tar" in body["error"], body
    other = await sapi.new_tenant_key("bundles-other")
    resp = await sapi.client.get(f"/api/sessions/{sid}/workspace", headers=sapi.headers(other))
    assert resp.status == 404
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace", key=other,
                                   json={"bundle": _bundle([(_file("a.txt"), b"a")])})
    assert status == 404, body
    status, _ = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/workspace",
                                   json={"bundle": _bundle([(_file("a.txt"), b"a")])})
    assert status == 400 and body["error"] == "Session is paused; resume it before restoring a workspace bundle"
