"""Attachments through a real server, real sandboxes and the fake model, on SQLite and PostgreSQL:
upload, list, download, delete and their limits; a message that names an image, a PDF and a CSV
shows the model the image and document blocks, writes the files into the workspace and records
them in the stored prompt."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.media import pdf, png
from tests.integration.test_sessions import create, deploy, send

pytestmark = pytest.mark.sandbox
MIB = 1024 * 1024


@pytest.fixture
async def aapi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:  # noqa: F811
    """A server whose attachments may be 1 MiB at most (SERVICE_ATTACHMENT_MAX_MB=1)."""
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        attachment_max_mb=1))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def _upload(api: Api, sid: str, filename: str, data: bytes, *, key: str | None = None,
                  **extra: Any) -> tuple[int, Any]:
    return await api.call("POST", f"/api/sessions/{sid}/attachments", key=key,
                          json={"filename": filename, "content": base64.b64encode(data).decode(), **extra})


async def _uploaded(api: Api, sid: str, filename: str, data: bytes, **extra: Any) -> dict[str, Any]:
    status, body = await _upload(api, sid, filename, data, **extra)
    assert status == 201, body
    attachment: dict[str, Any] = body["attachment"]
    return attachment


async def test_upload_list_download_delete(aapi: Api) -> None:
    await deploy(aapi)
    sid = (await create(aapi))["id"]
    image = png(4, 4)
    status, body = await _upload(aapi, sid, "chart.png", image, mimeType="application/octet-stream")
    assert status == 201, body
    first = body["attachment"]
    assert first["sessionId"] == sid and first["tenantId"] == "default"
    assert (first["filename"], first["mimeType"], first["size"]) == ("chart.png", "image/png", len(image))
    assert first["createdAt"].endswith("Z") and "messageId" not in first
    second = await _uploaded(aapi, sid, "résumé notes.csv", b"name,value\na,1\n")
    assert second["mimeType"] == "text/csv"

    status, body = await aapi.call("GET", f"/api/sessions/{sid}/attachments")
    assert status == 200 and body == {"attachments": [first, second]}

    resp = await aapi.client.get(f"/api/attachments/{first['id']}", headers=aapi.headers())
    assert resp.status == 200 and await resp.read() == image
    assert resp.headers["Content-Type"] == "image/png"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''chart.png"
    resp = await aapi.client.get(f"/api/attachments/{second['id']}", headers=aapi.headers())
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''r%C3%A9sum%C3%A9%20notes.csv"
    # A type the client declares is what the download says, but the page can never run.
    page = await _uploaded(aapi, sid, "x.html", b"<script>alert(1)</script>", mimeType="text/html")
    resp = await aapi.client.get(f"/api/attachments/{page['id']}", headers=aapi.headers())
    assert resp.headers["Content-Type"].startswith("text/html")
    assert resp.headers["Content-Security-Policy"].startswith("sandbox")
    assert resp.headers["Content-Disposition"].startswith("attachment;")

    status, body = await aapi.call("GET", "/api/storage")
    assert body["storage"]["attachments"] == {"count": 3, "bytes": len(image) + 15 + 25, "maxBytes": MIB}

    # Another tenant sees none of it.
    other = await aapi.new_tenant_key("acme")
    for method, path in (("GET", f"/api/attachments/{first['id']}"), ("DELETE", f"/api/attachments/{first['id']}"),
                         ("GET", f"/api/sessions/{sid}/attachments")):
        status, body = await aapi.call(method, path, key=other)
        assert status == 404 and body["statusCode"] == 404, (method, path, body)
    status, body = await _upload(aapi, sid, "a.txt", b"x", key=other)
    assert status == 404, body

    status, body = await aapi.call("DELETE", f"/api/attachments/{first['id']}")
    assert status == 204 and body == ""
    status, body = await aapi.call("GET", f"/api/attachments/{first['id']}")
    assert status == 404 and first["id"] in body["error"]
    status, _ = await aapi.call("DELETE", f"/api/attachments/{first['id']}")
    assert status == 404
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/attachments")
    assert [a["id"] for a in body["attachments"]] == [second["id"], page["id"]]


async def test_limits_and_rules(aapi: Api) -> None:
    await deploy(aapi)
    sid = (await create(aapi))["id"]
    status, body = await _upload(aapi, sid, "big.bin", b"\0" * (MIB + 1))
    assert status == 413 and "SERVICE_ATTACHMENT_MAX_MB" in body["error"], body
    assert body["statusCode"] == 413
    status, body = await _upload(aapi, sid, "exact.bin", b"\0" * MIB)
    assert status == 201 and body["attachment"]["size"] == MIB
    for name in ("../etc/passwd", "dir/a.txt", "a\\b", "", "..", "x" * 256, "bad\nname"):
        status, body = await _upload(aapi, sid, name, b"x")
        assert status == 400 and "filename" in body["error"], (name, body)
    status, body = await aapi.call("POST", f"/api/sessions/{sid}/attachments",
                                   json={"filename": "a.txt", "content": "not base64!"})
    assert status == 400 and "base64" in body["error"]
    status, body = await _upload(aapi, sid, "fake.png", b"GIF89a not really", mimeType="image/png")
    assert status == 400 and "image/png" in body["error"]
    status, body = await _upload(aapi, sid, "a.txt", b"x", mimeType="text plain")
    assert status == 400 and "mimeType" in body["error"]
    status, body = await _upload(aapi, sid, "a.txt", b"x", messageId="5e0b0c1e-0000-4000-8000-000000000000")
    assert status == 400 and "messageId" in body["error"]
    status, body = await _upload(aapi, sid, "a.txt", b"x", sessionId=sid)
    assert status == 400 and "sessionId" in body["error"]  # strict input: an undocumented field
    status, body = await _upload(aapi, "5e0b0c1e-0000-4000-8000-000000000000", "a.txt", b"x")
    assert status == 404
    status, body = await aapi.call("GET", "/api/sessions/5e0b0c1e-0000-4000-8000-000000000000/attachments")
    assert status == 404


async def test_a_message_shows_the_model_its_images_and_pdfs(aapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(aapi)
    sid = (await create(aapi))["id"]
    image, doc, table = png(2, 2), pdf("quarterly"), b"q,revenue\n1,10\n"
    pic = await _uploaded(aapi, sid, "pic.png", image)
    spec = await _uploaded(aapi, sid, "spec.pdf", doc)
    csv = await _uploaded(aapi, sid, "numbers.csv", table)

    status, frames = await send(aapi, sid, "describe these tok-attach-1",
                                attachments=[pic["id"], spec["id"], csv["id"]])
    assert status == 200 and frames[-1].event == "done", frames
    assert not [f for f in frames if f.event == "error"], frames

    # The model's request: the image and the document as base64 blocks, then the note, then the prompt.
    request = fake_model.requests_containing("tok-attach-1")[0]["body"]
    prompt = request["messages"][-1]
    assert prompt["role"] == "user"
    blocks = prompt["content"]
    assert blocks[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": base64.b64encode(image).decode()}}
    assert blocks[1] == {"type": "document", "title": "spec.pdf", "source": {
        "type": "base64", "media_type": "application/pdf", "data": base64.b64encode(doc).decode()}}
    assert "attachments/numbers.csv" in blocks[2]["text"] and "attachments/pic.png" in blocks[2]["text"]
    assert blocks[-1]["text"].endswith("describe these tok-attach-1")

    # Every attachment is a file of the workspace, the agent's to read.
    for name, data in (("pic.png", image), ("spec.pdf", doc), ("numbers.csv", table)):
        resp = await aapi.client.get(f"/api/sessions/{sid}/files/attachments/{name}", headers=aapi.headers())
        assert resp.status == 200 and await resp.read() == data, name

    # The stored prompt records them; the attachments are linked to it.
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/messages")
    user = [m for m in body["messages"] if m["role"] == "user"][0]
    stored = json.loads(user["content"])
    assert stored["content"] == "describe these tok-attach-1"
    assert [(a["id"], a["path"], a["shownToModel"]) for a in stored["attachments"]] == [
        (pic["id"], "attachments/pic.png", True), (spec["id"], "attachments/spec.pdf", True),
        (csv["id"], "attachments/numbers.csv", False)]
    assert base64.b64encode(image).decode() not in user["content"]  # the bytes are in the attachment row
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/attachments")
    assert {a["messageId"] for a in body["attachments"]} == {user["id"]}

    # The next turn's request still carries the image: it is part of the conversation.
    status, frames = await send(aapi, sid, "and now? tok-attach-2")
    assert frames[-1].event == "done"
    later = fake_model.requests_containing("tok-attach-2")[0]["body"]["messages"]
    assert later[0]["content"][0]["type"] == "image"


async def test_a_message_naming_what_is_not_its_sessions_is_refused(aapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(aapi)
    sid = (await create(aapi))["id"]
    other_sid = (await create(aapi))["id"]
    theirs = await _uploaded(aapi, other_sid, "a.txt", b"x")
    unknown = "5e0b0c1e-0000-4000-8000-000000000000"
    for ids, named in (([unknown], unknown), ([theirs["id"]], theirs["id"]), (["nope"], "nope")):
        status, body = await send(aapi, sid, "hello tok-attach-3", attachments=ids)
        assert status == 400 and named in body[0]["error"], body
    assert not fake_model.requests_containing("tok-attach-3")
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/messages")
    assert body["messages"] == []  # nothing was stored for a refused message
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/files")
    assert not [f for f in body["files"] if f["path"].startswith("attachments")]


async def test_attachments_are_written_within_the_disk_quota(aapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(aapi)
    sid = (await create(aapi, diskMb=32))["id"]
    blob = await _uploaded(aapi, sid, "blob.bin", bytes(range(256)) * 4096)  # 1 MiB
    status, body = await aapi.call("POST", f"/api/sessions/{sid}/exec",
                                   json={"command": "head -c 64M /dev/zero > fill.bin; true"})
    assert status == 200, body
    status, body = await send(aapi, sid, "read it tok-attach-full", attachments=[blob["id"]])
    assert status == 507 and "diskMb" in body[0]["error"], body
    assert not fake_model.requests_containing("tok-attach-full")
    status, body = await aapi.call("GET", f"/api/sessions/{sid}/messages")
    assert body["messages"] == []  # refused before the prompt was stored
    # Room again: the same message goes through.
    status, body = await aapi.call("POST", f"/api/sessions/{sid}/exec", json={"command": "rm fill.bin"})
    assert status == 200, body
    status, frames = await send(aapi, sid, "read it tok-attach-full", attachments=[blob["id"]])
    assert status == 200 and frames[-1].event == "done"
    assert fake_model.requests_containing("tok-attach-full")
    # A paused session says what to do, as a message without attachments would.
    status, body = await aapi.call("POST", f"/api/sessions/{sid}/pause")
    assert status == 200, body
    status, body = await send(aapi, sid, "again", attachments=[blob["id"]])
    assert status == 400 and "resume it" in body[0]["error"], body
