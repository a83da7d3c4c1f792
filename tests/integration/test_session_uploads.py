"""POST /api/sessions/{id}/files through a real server and real sandboxes: files land in the live
workspace as the sandbox user's, and a workspace the sandbox filled with links cannot make the
server (root) write anywhere else."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi  # noqa: F401

pytestmark = pytest.mark.sandbox


async def _upload(api: Api, sid: str, files: list[dict[str, str]], **extra: str) -> tuple[int, dict[str, object]]:
    return await api.call("POST", f"/api/sessions/{sid}/files", json={"files": files, **extra})


async def _exec(api: Api, sid: str, command: str) -> str:
    status, body = await api.call("POST", f"/api/sessions/{sid}/exec", json={"command": command})
    assert status == 200, body
    return str(body["stdout"])


async def test_uploaded_files_are_the_agents_to_read_and_change(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    png = bytes(range(256))
    status, body = await _upload(sapi, sid, [
        {"path": "notes/todo.txt", "content": "buy milk\n"},
        {"path": "img/logo.png", "content": base64.b64encode(png).decode(), "encoding": "base64",
         "mimeType": "image/png"},
    ], targetPath="inbox")
    assert status == 200, body
    assert body == {"files": [{"path": "inbox/notes/todo.txt", "size": 9}, {"path": "inbox/img/logo.png", "size": 256}]}
    # The agent's own user owns them and can change them; the files API reads them back.
    out = await _exec(sapi, sid, "stat -c '%u %a' inbox inbox/notes inbox/notes/todo.txt; id -u; "
                                 "echo more >> inbox/notes/todo.txt && cat inbox/notes/todo.txt; "
                                 "md5sum < inbox/img/logo.png")
    lines = out.splitlines()
    uid = lines[3]
    assert lines[0:3] == [f"{uid} 700", f"{uid} 700", f"{uid} 644"]
    assert lines[4:6] == ["buy milk", "more"]
    import hashlib

    assert lines[6].split()[0] == hashlib.md5(png).hexdigest()  # noqa: S324 - a checksum, not security
    status, raw = await sapi.call("GET", f"/api/sessions/{sid}/files/inbox/notes/todo.txt?format=json")
    assert status == 200 and raw["content"] == "buy milk\nmore\n"
    # A second upload replaces the file.
    status, _ = await _upload(sapi, sid, [{"path": "inbox/notes/todo.txt", "content": "nothing"}])
    assert status == 200
    assert await _exec(sapi, sid, "cat inbox/notes/todo.txt") == "nothing"


async def test_links_planted_by_the_sandbox_are_never_followed(sapi: Api, tmp_path: Path) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    victim = tmp_path / "host-file.txt"
    victim.write_text("host data")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    # Inside the sandbox these point at paths that exist on the host, where the server writes as root.
    await _exec(sapi, sid, f"ln -s {victim} victim.txt; ln -s {host_dir} escape; mkdir -p real")
    status, body = await _upload(sapi, sid, [{"path": "escape/planted.txt", "content": "x"}])
    assert status == 400 and "escape" in str(body["error"]), body
    assert not (host_dir / "planted.txt").exists()
    status, body = await _upload(sapi, sid, [{"path": "victim.txt", "content": "overwritten"}])
    assert status == 200, body  # the link itself is replaced by a file; its target is untouched
    assert victim.read_text() == "host data"
    assert await _exec(sapi, sid, "test -L victim.txt || cat victim.txt") == "overwritten"
    status, body = await _upload(sapi, sid, [{"path": "x.txt", "content": "x"}], targetPath="escape")
    assert status == 400 and not (host_dir / "x.txt").exists()


async def test_upload_errors(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    for files, message in (([], "`files` must be a non-empty array"),
                           ([{"path": "../out.txt", "content": "x"}], "'..'"),
                           ([{"path": "/etc/passwd", "content": "x"}], "relative"),
                           ([{"path": "a.txt", "content": 5}], "`files[0].content` must be a string")):
        status, body = await _upload(sapi, sid, files)
        assert status == 400 and message in str(body["error"]), (files, body)
    status, body = await _upload(sapi, sid, [{"path": "a.txt", "content": "x"}], targetPath="../up")
    assert status == 400, body
    await _exec(sapi, sid, "mkdir -p adir")
    status, body = await _upload(sapi, sid, [{"path": "adir", "content": "x"}])
    assert status == 400 and "directory" in str(body["error"]), body
    other = await sapi.new_tenant_key("uploads-other")
    status, body = await sapi.call("POST", f"/api/sessions/{sid}/files", key=other,
                                   json={"files": [{"path": "a.txt", "content": "x"}]})
    assert status == 404, body
    status, _ = await sapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200
    status, body = await _upload(sapi, sid, [{"path": "a.txt", "content": "x"}])
    assert status == 400 and body["error"] == "Session is paused; resume it before uploading files"


async def test_a_full_workspace_disk_is_507_naming_the_quota(sapi: Api) -> None:  # noqa: F811
    await deploy(sapi)
    sid = (await create(sapi, diskMb=32))["id"]
    big = base64.b64encode(b"\0" * (6 * 1024 * 1024)).decode()  # under the 20 MiB request limit
    statuses = []
    for i in range(8):  # 48 MiB into a 32 MiB disk
        status, body = await _upload(sapi, sid, [{"path": f"big-{i}.bin", "content": big, "encoding": "base64"}])
        statuses.append(status)
        if status != 200:
            break
    assert statuses[-1] == 507 and "diskMb" in str(body["error"]), (statuses, body)
    assert set(statuses[:-1]) == {200}
    # The session still works: remove files and write again.
    await _exec(sapi, sid, "rm -f big-*.bin")
    status, body = await _upload(sapi, sid, [{"path": "small.txt", "content": "fits"}])
    assert status == 200, body
