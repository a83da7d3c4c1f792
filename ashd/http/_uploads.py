"""How the contents of uploaded agent files are read: text, base64, or what the client meant.

ashd's own contract is `{path, content, encoding?}`: `content` is UTF-8 text unless `encoding` is
`"base64"`. The reference implementation's clients (its `ash deploy` CLI, its SDKs and dashboard)
always send base64 and never the `encoding` field, because that server always decodes. So in a
request where no file names an encoding, the contents are taken as base64 when every one of them is
canonical base64 and the system prompt file, if present, decodes to UTF-8 text; otherwise they are
all text, as before. Real text almost never passes (a space, a newline or punctuation is enough to
fail), and a one-word prompt that does is caught by the UTF-8 check. A client that wants no guessing
sends `encoding` (`"base64"` or `"utf-8"`) on its files.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ashd.errors import BadRequest
from ashd.storage import SYSTEM_PROMPT_FILE, AgentFile

TEXT_ENCODINGS = (None, "utf-8", "utf8", "text")


def _canonical_base64(text: str) -> bytes | None:
    """The bytes `text` encodes, if it is exactly what base64 would produce for them; else None."""
    if len(text) % 4:
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode() == text else None


def _reference_upload(items: list[tuple[str, str]]) -> list[bytes] | None:
    """The decoded contents if the request looks like a reference client's base64 upload."""
    decoded = []
    for path, content in items:
        data = _canonical_base64(content)
        if data is None:
            return None
        if path.strip("/") == SYSTEM_PROMPT_FILE:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                return None
        decoded.append(data)
    return decoded


def files_from_body(raw: Any) -> list[AgentFile] | None:
    """The `files` of a deploy request as bytes; BadRequest naming the entry that is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("`files` must be an array of {path, content, encoding?}")
    items: list[tuple[str, str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise BadRequest(f"`files[{i}]` must be an object with a string `path`")
        content, encoding = item.get("content"), item.get("encoding")
        if not isinstance(content, str):
            raise BadRequest(f"`files[{i}].content` must be a string")
        if encoding != "base64" and encoding not in TEXT_ENCODINGS:
            raise BadRequest(f"`files[{i}].encoding` must be \"base64\", \"utf-8\" or omitted")
        items.append((item["path"], content, encoding))
    if items and not any("encoding" in item for item in raw):
        decoded = _reference_upload([(path, content) for path, content, _ in items])
        if decoded is not None:
            return [AgentFile(path, data) for (path, _, _), data in zip(items, decoded, strict=True)]
    files = []
    for i, (path, content, encoding) in enumerate(items):
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise BadRequest(f"`files[{i}].content` is not valid base64") from exc
        else:
            data = content.encode()
        files.append(AgentFile(path, data))
    return files
