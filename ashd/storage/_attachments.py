"""Attachments: files a client gives a session (`POST /api/sessions/{id}/attachments`), for a later
message to name.

The bytes are kept in the database row, not on one server's disk, so every coordinator on a shared
database serves them. A row belongs to its tenant and session: another tenant's id is a 404, like an
unknown one. A message that names attachments links the rows to its stored user message
(`Sessions.add_user_message`), unless the upload already named one.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session as SyncSession

from ashd.errors import BadRequest, NotFound
from ashd.storage._database import Database
from ashd.storage._files import mime_type as mime_from_name
from ashd.storage._models import Attachment, Message, Session, iso, new_id, utcnow

FILENAME_MAX_BYTES = 255  # a file name on the workspace's filesystem (ext4): the name is written there
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # what the Messages API shows the model
PDF_TYPE = "application/pdf"
OCTET_STREAM = "application/octet-stream"
_MIME = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}"
                   r"(\s*;\s*[a-z0-9!#$&^_.+-]+=(\"[^\"\\\x00-\x1f]*\"|[a-z0-9!#$&^_.+-]+))*$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class AttachmentRecord:
    id: str
    tenant_id: str
    session_id: str
    message_id: str | None
    filename: str
    mime_type: str
    size: int
    created_at: Any

    @classmethod
    def of(cls, row: Attachment) -> AttachmentRecord:
        return cls(row.id, row.tenant_id, row.session_id, row.message_id, row.filename, row.mime_type, row.size,
                   row.created_at)

    def to_json(self) -> dict[str, Any]:
        """The interface's Attachment object (ash-ai-sdk's `Attachment` model)."""
        out: dict[str, Any] = {"id": self.id, "tenantId": self.tenant_id, "sessionId": self.session_id,
                               "filename": self.filename, "mimeType": self.mime_type, "size": self.size,
                               "createdAt": iso(self.created_at)}
        if self.message_id is not None:
            out["messageId"] = self.message_id
        return out


@dataclass(frozen=True)
class AttachmentData:
    record: AttachmentRecord
    data: bytes


def check_filename(name: str) -> str:
    """A plain file name: no directories, no control characters, at most 255 bytes in UTF-8."""
    if not name or not name.strip(" ."):
        raise BadRequest("`filename` must be a file name such as `report.pdf` (not empty, not only dots)")
    if "/" in name or "\\" in name:
        raise BadRequest(f"`filename` {name[:100]!r} has a path separator: send the file's name only, "
                         "without directories")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise BadRequest("`filename` has a control character")
    if len(name.encode()) > FILENAME_MAX_BYTES:
        raise BadRequest(f"`filename` is {len(name.encode())} bytes in UTF-8; at most {FILENAME_MAX_BYTES}")
    return name


def sniff(data: bytes) -> str | None:
    """The type of the content for the kinds the model is shown (images, PDFs), from its first bytes."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if b"%PDF-" in data[:1024]:
        return PDF_TYPE
    return None


def resolve_mime(declared: str | None, filename: str, data: bytes) -> str:
    """The type stored for an upload. A declared type is kept (lower-cased), but one the model would
    be shown (an image or a PDF) must match the content, since the model API refuses a mismatch. An
    absent or `application/octet-stream` one (the published client's default) is taken from the
    content for images and PDFs, else from the file name's extension."""
    if declared is not None:
        declared = declared.strip().lower()
        if len(declared) > 255 or not _MIME.match(declared):
            raise BadRequest("`mimeType` must be a media type such as `image/png` or `text/csv`")
    found = sniff(data)
    if declared and declared != OCTET_STREAM:
        base = declared.split(";", 1)[0].strip()
        if base in (*IMAGE_TYPES, PDF_TYPE) and found != base:
            raise BadRequest(f"`mimeType` is {base} but the content is "
                             f"{'a ' + found + ' file' if found else 'not a ' + base.split('/')[-1].upper() + ' file'}"
                             f"; send the right type, or `application/octet-stream` to have it detected")
        return declared
    return found or mime_from_name(filename)


def model_block_kind(mime: str) -> str | None:
    """`image` or `document`: the content block the model is shown this type as; None: a file only."""
    base = mime.split(";", 1)[0].strip()
    if base in IMAGE_TYPES:
        return "image"
    if base == PDF_TYPE:
        return "document"
    return None


class Attachments:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, tenant: str, session_id: str, filename: str, mime: str, data: bytes,
                     message_id: str | None = None) -> AttachmentRecord:
        now = utcnow()

        def run(s: SyncSession) -> AttachmentRecord:
            found = s.execute(select(Session.id).where(Session.id == session_id, Session.tenant_id == tenant))
            if found.scalar_one_or_none() is None:
                raise NotFound(f"Session {session_id} not found")
            if message_id is not None:
                owner = s.execute(select(Message.id).where(Message.id == message_id,
                                                           Message.session_id == session_id))
                if owner.scalar_one_or_none() is None:
                    raise BadRequest(f"`messageId` {message_id} is not a message of session {session_id} "
                                     "(GET /api/sessions/{id}/messages lists them)")
            row = Attachment(id=new_id(), tenant_id=tenant, session_id=session_id, message_id=message_id,
                             filename=filename, mime_type=mime, size=len(data), storage_path="", content=data,
                             created_at=now)
            s.add(row)
            s.flush()
            return AttachmentRecord.of(row)

        return await self.db.run_tx(run)

    async def list(self, tenant: str, session_id: str) -> builtins.list[AttachmentRecord]:
        def run(s: SyncSession) -> builtins.list[AttachmentRecord]:  # one hop to a reader thread
            found = s.execute(select(Session.id).where(Session.id == session_id, Session.tenant_id == tenant))
            if found.scalar_one_or_none() is None:
                raise NotFound(f"Session {session_id} not found")
            rows = s.execute(select(Attachment).where(
                Attachment.session_id == session_id, Attachment.tenant_id == tenant)
                .order_by(Attachment.created_at, Attachment.id)).scalars()
            return [AttachmentRecord.of(r) for r in rows]

        return await self.db.run_read(run)

    async def read(self, tenant: str, attachment_id: str) -> AttachmentData:
        """The attachment with its bytes; 404 for an unknown id or another tenant's."""
        query = select(Attachment, Attachment.content).where(Attachment.id == attachment_id,
                                                             Attachment.tenant_id == tenant)
        row = await self.db.run_read(lambda s: s.execute(query).one_or_none())
        if row is None:
            raise NotFound(f"Attachment {attachment_id} not found")
        return AttachmentData(AttachmentRecord.of(row[0]), bytes(row[1] or b""))

    async def delete(self, tenant: str, attachment_id: str) -> None:
        def run(s: SyncSession) -> None:
            gone = s.execute(delete(Attachment).where(Attachment.id == attachment_id,
                                                      Attachment.tenant_id == tenant))
            if not gone.rowcount:  # type: ignore[attr-defined]
                raise NotFound(f"Attachment {attachment_id} not found")

        await self.db.run_tx(run)

    async def for_message(self, tenant: str, session_id: str, ids: Sequence[str]) -> builtins.list[AttachmentData]:
        """The attachments a message names, in its order, with their bytes. An id that is not an
        attachment of this session (unknown, another session's or another tenant's) is a 400 naming it."""
        wanted = [i for i in ids if _UUID.match(i)]
        query = select(Attachment, Attachment.content).where(
            Attachment.id.in_(wanted), Attachment.session_id == session_id, Attachment.tenant_id == tenant)
        rows = {r[0].id: r for r in await self.db.run_read(lambda s: s.execute(query).all())} if wanted else {}
        unknown = [i for i in ids if i not in rows]
        if unknown:
            raise BadRequest(f"`attachments`: {', '.join(unknown[:10])} "
                             f"{'is not an attachment' if len(unknown) == 1 else 'are not attachments'} of "
                             f"session {session_id}; upload with POST /api/sessions/{session_id}/attachments "
                             "and name the ids it returns")
        return [AttachmentData(AttachmentRecord.of(rows[i][0]), bytes(rows[i][1] or b"")) for i in ids]
