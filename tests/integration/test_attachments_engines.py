# ruff: noqa: F811  (fixtures are imported by name until the root conftest registers them)
"""A prompt with attachments, as the server builds it, reaches the model with its image and
document blocks on both engines (a real bridge process, the model proxy, the fake model)."""

from __future__ import annotations

import base64
import datetime as dt

from ashd.backends._attachments import model_content, prepare
from ashd.devtools.fake_model import FakeModel
from ashd.storage import AttachmentData, AttachmentRecord
from tests.fixtures.bridge_fixture import BridgeHarness, bridge, collect  # noqa: F401
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.media import pdf, png
from tests.integration.test_engines_both import engine, result_of  # noqa: F401


def _item(ident: str, name: str, mime: str, data: bytes) -> AttachmentData:
    return AttachmentData(AttachmentRecord(ident, "t", "s", None, name, mime, len(data), dt.datetime.now(dt.UTC)),
                          data)


async def test_images_and_pdfs_reach_the_model(engine: str, bridge: BridgeHarness, fake_model: FakeModel) -> None:
    image, doc = png(2, 2), pdf("engines")
    items = [_item("11111111-0000-4000-8000-000000000001", "pic.png", "image/png", image),
             _item("22222222-0000-4000-8000-000000000002", "spec.pdf", "application/pdf", doc)]
    _, records = prepare(items)
    conn = await bridge.init({"engine": engine})
    frames = await collect(conn, model_content("BOTH-ATTACH what is this?", items, records))
    assert result_of(frames)["subtype"] == "success"
    prompt = fake_model.requests_containing("BOTH-ATTACH")[0]["body"]["messages"][-1]["content"]
    media = {b["type"]: b["source"] for b in prompt if b.get("type") in ("image", "document")}
    assert media["image"] == {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    assert media["document"]["data"] == base64.b64encode(doc).decode()
    assert any("attachments/spec.pdf" in b.get("text", "") for b in prompt)
