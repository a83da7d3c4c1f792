"""A loopback HTTP entrance to the model proxy, for programs that cannot speak HTTP over a Unix socket.

The sandbox has no network but its own loopback. The Claude Code CLI (the `claude-agent-sdk`
engine) only takes an `ANTHROPIC_BASE_URL`, so the bridge listens on `127.0.0.1:<free port>` and
copies each connection, byte for byte, to the server's model proxy socket. The proxy then does
what it does for the built-in engine: checks the model policy and budgets, and puts the session's
real key in place of the placeholder the CLI sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


class LoopbackForwarder:
    def __init__(self, model_socket: str) -> None:
        self.model_socket = model_socket
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.model_socket)
        except OSError as exc:
            log.warning("model proxy socket %s unreachable: %s", self.model_socket, exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
