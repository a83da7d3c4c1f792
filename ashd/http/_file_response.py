"""A file's bytes as a download: the one raw-file streaming loop of the API (agent folders, session files)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import BinaryIO

from aiohttp import web

from ashd.storage import check_raw_size, content_disposition, mime_type

_CHUNK = 256 * 1024


async def send_file(request: web.Request, stream: BinaryIO, size: int, rel: str,
                    headers: Mapping[str, str] | None = None) -> web.StreamResponse:
    """Stream `size` bytes of `stream` (closed here, whatever happens) as the file `rel`.

    A file that shrinks while being read gives the client a short body; one that grows is cut at
    `size`, the Content-Length already sent.
    """
    try:
        check_raw_size(size)
        resp = web.StreamResponse(headers={
            "Content-Type": mime_type(rel),
            "Content-Disposition": content_disposition(rel),
            "Content-Length": str(size),
            **(headers or {}),
        })
        await resp.prepare(request)
        remaining = size
        while remaining > 0:
            chunk = await asyncio.to_thread(stream.read, min(_CHUNK, remaining))
            if not chunk:
                break
            await resp.write(chunk)
            remaining -= len(chunk)
        await resp.write_eof()
        return resp
    finally:
        await asyncio.to_thread(stream.close)
