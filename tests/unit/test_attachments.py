"""Attachment rules without a server: file names, media types, what the model is shown, the note a
cold resume keeps, and the token estimate of inline media."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from ashd.backends._attachments import MAX_IMAGE_BYTES, MAX_INLINE_BYTES, check_ids, model_content, prepare
from ashd.bridge.engine._compact import IMAGE_TOKENS, estimate_tokens
from ashd.bridge.history import history_from_stored
from ashd.errors import BadRequest
from ashd.storage import AttachmentData, AttachmentRecord, check_filename, resolve_mime
from tests.fixtures.media import pdf, png


def _item(name: str, mime: str, data: bytes, ident: str = "0b5e9c1a-0000-4000-8000-000000000001") -> AttachmentData:
    return AttachmentData(AttachmentRecord(ident, "t", "s", None, name, mime, len(data), dt.datetime.now(dt.UTC)),
                          data)


@pytest.mark.parametrize("name", ["", "..", " . ", "a/b.txt", "../x", "a\\b", "tab\there", "x" * 256,
                                  "é" * 128])
def test_bad_filenames_are_refused(name: str) -> None:
    with pytest.raises(BadRequest):
        check_filename(name)


@pytest.mark.parametrize("name", ["report.pdf", ".env", "a..b", "x" * 255, "résumé (final).docx"])
def test_plain_filenames_pass(name: str) -> None:
    assert check_filename(name) == name


def test_media_types() -> None:
    image, doc = png(), pdf()
    # Absent or the client's default octet-stream: images and PDFs by content, the rest by extension.
    assert resolve_mime(None, "x.bin", image) == "image/png"
    assert resolve_mime("application/octet-stream", "scan", doc) == "application/pdf"
    assert resolve_mime(None, "data.csv", b"a,b\n") == "text/csv"
    assert resolve_mime(None, "blob", b"\x00\x01") == "application/octet-stream"
    # A declared type is kept; an image or PDF type must match the content.
    assert resolve_mime("Text/Plain; charset=utf-8", "a.txt", b"hi") == "text/plain; charset=utf-8"
    assert resolve_mime("image/png", "a.png", image) == "image/png"
    with pytest.raises(BadRequest, match="image/png"):
        resolve_mime("image/png", "a.png", b"not an image")
    with pytest.raises(BadRequest, match="image/png"):
        resolve_mime("application/pdf", "a.pdf", image)
    for bad in ("png", "image/png\r\nX-Evil: 1", "a/b/c", " /x"):
        with pytest.raises(BadRequest, match="mimeType"):
            resolve_mime(bad, "a", b"x")


def test_message_ids_field() -> None:
    assert check_ids(None) == ()
    assert check_ids(["a", "b"]) == ("a", "b")
    for bad in ("a", [1], ["a", "a"], [""], [str(i) for i in range(21)]):
        with pytest.raises(BadRequest, match="attachments"):
            check_ids(bad)


def test_model_content_shows_images_and_pdfs_and_names_every_file() -> None:
    image, doc = png(), pdf()
    items = [_item("pic.png", "image/png", image, "11111111-0000-4000-8000-000000000001"),
             _item("spec.pdf", "application/pdf", doc, "22222222-0000-4000-8000-000000000002"),
             _item("data.csv", "text/csv", b"a,b\n", "33333333-0000-4000-8000-000000000003"),
             _item("pic.png", "image/png", image, "44444444-0000-4000-8000-000000000004")]
    files, records = prepare(items)
    assert [f.path for f in files] == ["pic.png", "spec.pdf", "data.csv", "pic-44444444.png"]
    assert [r["path"] for r in records] == ["attachments/pic.png", "attachments/spec.pdf", "attachments/data.csv",
                                            "attachments/pic-44444444.png"]
    assert [r["shownToModel"] for r in records] == [True, True, False, True]
    blocks = model_content("what is this?", items, records)
    assert blocks[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": base64.b64encode(image).decode()}}
    assert blocks[1] == {"type": "document", "title": "spec.pdf", "source": {
        "type": "base64", "media_type": "application/pdf", "data": base64.b64encode(doc).decode()}}
    assert blocks[2]["type"] == "image"
    note = blocks[3]["text"]
    assert "attachments/data.csv (text/csv, 4 bytes; not shown inline" in note
    assert "attachments/pic.png (image/png" in note
    assert blocks[4] == {"type": "text", "text": "what is this?"}
    # Content blocks from the client come after, as they were.
    assert model_content([{"type": "text", "text": "x"}], items, records)[-1] == {"type": "text", "text": "x"}


def test_what_the_model_api_or_the_bridge_cannot_take_stays_a_file() -> None:
    big_image = b"\x89PNG\r\n\x1a\n" + b"\0" * MAX_IMAGE_BYTES
    pdf_part = b"%PDF-1.4\n" + b"\0" * (MAX_INLINE_BYTES // 2)
    items = [_item("big.png", "image/png", big_image), _item("a.pdf", "application/pdf", pdf_part),
             _item("b.pdf", "application/pdf", pdf_part)]
    _, records = prepare(items)
    assert [r["shownToModel"] for r in records] == [False, True, False]  # 5 MiB images; 10 MiB in all
    kinds = [b["type"] for b in model_content("x", items, records)]
    assert kinds == ["document", "text", "text"]


def test_a_cold_resume_keeps_the_note_not_the_bytes() -> None:
    record = {"id": "i", "filename": "pic.png", "mimeType": "image/png", "size": 9, "path": "attachments/pic.png",
              "shownToModel": True}
    rows: list[dict[str, Any]] = [{"type": "user", "content": "look", "attachments": [record]},
            {"type": "result", "subtype": "success", "result": "ok"}]
    first = history_from_stored(rows)[0]
    assert first["role"] == "user"
    assert first["content"][0]["type"] == "text" and "attachments/pic.png" in first["content"][0]["text"]
    assert "read the file" in first["content"][0]["text"]
    assert first["content"][1] == {"type": "text", "text": "look"}


def test_inline_media_is_estimated_in_tokens_not_characters() -> None:
    data = base64.b64encode(b"\0" * 3_000_000).decode()
    messages = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64",
                                                                          "media_type": "image/png", "data": data}},
                                             {"type": "text", "text": "hi"}]}]
    assert IMAGE_TOKENS <= estimate_tokens(messages) < IMAGE_TOKENS + 100
    doc = [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}]
    assert 50_000 < estimate_tokens(doc) < 200_000  # 3 MB of PDF: about 100k tokens, not 1M characters' worth
