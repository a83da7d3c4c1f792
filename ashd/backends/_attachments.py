"""A message's attachments: the files written into the workspace, what the stored prompt records,
and the content the model is given.

Every attachment becomes `attachments/<filename>` in the workspace. Images (PNG, JPEG, GIF, WebP)
and PDFs are also shown to the model inline, as base64 `image` and `document` blocks ahead of the
prompt, when they are within what the model API and the bridge take: an image up to 5 MiB (the
Messages API refuses larger ones) and, together, up to 10 MiB per message (the query, base64, must
fit one 16 MiB bridge frame). One past those is still a file, and the note the model reads says so.
"""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Sequence
from typing import Any

from ashd.bridge.history import attachments_note
from ashd.errors import BadRequest
from ashd.storage import MIB, AgentFile, AttachmentData, model_block_kind

FILENAME_MAX_BYTES = 255

WORKSPACE_DIR = "attachments"
MAX_PER_MESSAGE = 20
MAX_IMAGE_BYTES = 5 * MIB
MAX_INLINE_BYTES = 10 * MIB


def check_ids(value: Any) -> tuple[str, ...]:
    """The `attachments` field of a message body: distinct attachment ids."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest("`attachments` must be an array of attachment ids")
    if len(value) > MAX_PER_MESSAGE:
        raise BadRequest(f"`attachments` names {len(value)} attachments; at most {MAX_PER_MESSAGE} per message")
    if len(set(value)) != len(value):
        raise BadRequest("`attachments` names an attachment twice")
    return tuple(value)


def _names(items: Sequence[AttachmentData]) -> list[str]:
    """Workspace file names: the upload's name; a name repeated within one message gets the
    attachment's short id, so no attachment of the message overwrites another."""
    seen: set[str] = set()
    names = []
    for item in items:
        name = item.record.filename
        if name in seen:
            stem, ext = posixpath.splitext(name)
            name = f"{stem}-{item.record.id[:8]}{ext}"
            if len(name.encode()) > FILENAME_MAX_BYTES:  # a name at the limit already: the id alone
                name = f"{item.record.id}{ext[:16]}"
        seen.add(name)
        names.append(name)
    return names


def prepare(items: Sequence[AttachmentData]) -> tuple[list[AgentFile], list[dict[str, Any]]]:
    """The files to write (relative to WORKSPACE_DIR) and the records the stored prompt keeps."""
    files: list[AgentFile] = []
    records: list[dict[str, Any]] = []
    inline = 0
    for item, name in zip(items, _names(items), strict=True):
        rec = item.record
        kind = model_block_kind(rec.mime_type)
        shown = kind is not None and rec.size > 0 and inline + rec.size <= MAX_INLINE_BYTES \
            and not (kind == "image" and rec.size > MAX_IMAGE_BYTES)
        inline += rec.size if shown else 0
        files.append(AgentFile(path=name, data=item.data))
        records.append({"id": rec.id, "filename": rec.filename, "mimeType": rec.mime_type, "size": rec.size,
                        "path": f"{WORKSPACE_DIR}/{name}", "shownToModel": shown})
    return files, records


def model_content(content: Any, items: Sequence[AttachmentData], records: Sequence[dict[str, Any]]) -> list[Any]:
    """The prompt as the model gets it: the inline blocks, the note naming every file, then the
    message's own content."""
    blocks: list[Any] = []
    for item, rec in zip(items, records, strict=True):
        if not rec["shownToModel"]:
            continue
        media = item.record.mime_type.split(";", 1)[0].strip()
        source = {"type": "base64", "media_type": media, "data": base64.b64encode(item.data).decode("ascii")}
        if model_block_kind(media) == "image":
            blocks.append({"type": "image", "source": source})
        else:
            blocks.append({"type": "document", "source": source, "title": item.record.filename})
    blocks.append({"type": "text", "text": attachments_note(list(records))})
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    else:
        blocks.extend(content)
    return blocks
