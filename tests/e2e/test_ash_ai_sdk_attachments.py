"""ash-ai-sdk 0.0.22's own attachment functions against a real ashd: every answer parses into its
generated models, and a message naming the upload (an extra body field of its message model)
shows the model the image."""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import pytest
from ash_sdk import AuthenticatedClient  # type: ignore[import-untyped]
from ash_sdk.api.attachments import (  # type: ignore[import-untyped]
    delete_api_attachments_id,
    get_api_attachments_id,
)
from ash_sdk.api.sessions import (  # type: ignore[import-untyped]
    get_api_sessions_id_attachments,
    post_api_sessions_id_attachments,
    post_api_sessions_id_messages,
)
from ash_sdk.models import (  # type: ignore[import-untyped]
    ApiError,
    Attachment,
    GetApiSessionsIdAttachmentsResponse200,
    PostApiSessionsIdAttachmentsBody,
    PostApiSessionsIdAttachmentsResponse201,
    PostApiSessionsIdMessagesBody,
)

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.fixtures.media import png
from tests.integration.test_sessions import create, deploy, sapi  # noqa: F401

pytestmark = pytest.mark.sandbox


async def test_sdk_attachment_functions(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    sid = uuid.UUID((await create(sapi))["id"])
    # The SDK's download function documents no 200 (its spec gives the bytes no schema): it answers
    # `parsed=None` with the bytes in `content`, unless told to raise on undocumented statuses.
    client = AuthenticatedClient(base_url=str(sapi.client.make_url("")).rstrip("/"), token=sapi.key)
    image = png(3, 3)

    def run() -> dict[str, Any]:
        # The SDK's body sends mimeType "application/octet-stream" by default: the content says PNG.
        created = post_api_sessions_id_attachments.sync_detailed(sid, client=client, body=PostApiSessionsIdAttachmentsBody(
            filename="dot.png", content=base64.b64encode(image).decode()))
        assert created.status_code == 201, created.content
        assert isinstance(created.parsed, PostApiSessionsIdAttachmentsResponse201)
        attachment = created.parsed.attachment
        assert isinstance(attachment, Attachment)
        assert attachment.session_id == sid and attachment.filename == "dot.png"
        assert attachment.mime_type == "image/png" and attachment.size == len(image)
        assert attachment.tenant_id == "default" and not attachment.additional_properties

        too_big = post_api_sessions_id_attachments.sync_detailed(sid, client=client, body=PostApiSessionsIdAttachmentsBody(
            filename="big.bin", content=base64.b64encode(b"\0" * (10 * 1024 * 1024 + 1)).decode()))
        assert too_big.status_code == 413 and isinstance(too_big.parsed, ApiError)
        assert "SERVICE_ATTACHMENT_MAX_MB" in too_big.parsed.error

        listed = get_api_sessions_id_attachments.sync(sid, client=client)
        assert isinstance(listed, GetApiSessionsIdAttachmentsResponse200)
        assert [a.id for a in listed.attachments] == [attachment.id]

        downloaded = get_api_attachments_id.sync_detailed(attachment.id, client=client)
        assert downloaded.status_code == 200 and downloaded.content == image and downloaded.parsed is None
        assert downloaded.headers["x-content-type-options"] == "nosniff"

        body = PostApiSessionsIdMessagesBody(content="what colour? tok-sdk-attach")
        body["attachments"] = [str(attachment.id)]
        # The generated send function reads the SSE answer as JSON (and fails on it); AshClient's
        # stream takes no extra fields. So: the generated request, sent by the SDK's own httpx client.
        kwargs = post_api_sessions_id_messages._get_kwargs(sid, body=body)
        sent = client.get_httpx_client().request(**kwargs)
        assert kwargs["json"]["attachments"] == [str(attachment.id)]
        assert sent.status_code == 200 and "event: done" in sent.text and "event: error" not in sent.text

        linked = get_api_sessions_id_attachments.sync(sid, client=client)
        assert isinstance(linked.attachments[0].message_id, str)

        deleted = delete_api_attachments_id.sync_detailed(attachment.id, client=client)
        assert deleted.status_code == 204
        missing = get_api_attachments_id.sync_detailed(attachment.id, client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, ApiError)
        again = delete_api_attachments_id.sync_detailed(attachment.id, client=client)
        assert again.status_code == 404 and isinstance(again.parsed, ApiError)
        return {"id": str(attachment.id)}

    await asyncio.to_thread(run)
    request = fake_model.requests_containing("tok-sdk-attach")[0]["body"]
    assert request["messages"][-1]["content"][0]["source"]["data"] == base64.b64encode(image).decode()
