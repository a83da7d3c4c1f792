"""The per-sandbox model proxy: the only way a sandbox reaches the model API.

Listens on `<sandbox run dir>/model.sock` (inside: /run/ashd/model.sock), forwards `/v1/messages`
and `/v1/messages/count_tokens` to the configured Anthropic base URL with the real credential,
and streams the reply back byte for byte. The sandbox sends a dummy key; whatever auth header it
sends is dropped, so no API key ever enters the sandbox.

aiohttp's server is used here on a Unix socket (an explicit exception to "no aiohttp.web in
domain code" granted for this module): it is an HTTP proxy, not part of the REST API.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

log = logging.getLogger(__name__)

KeyProvider = Callable[[], "str | Awaitable[str | None] | None"]
_SANDBOX_ID = web.AppKey("sandbox_id", str)
ALLOWED_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
_DROP_REQUEST = frozenset(
    {
        "host",
        "authorization",
        "x-api-key",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    }
)
_DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"})


@dataclass
class ProxyStats:
    requests: int = 0
    errors: int = 0
    bytes_in: int = 0  # request bodies sent upstream
    bytes_out: int = 0  # response bodies sent back to the sandbox


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


class ModelProxy:
    def __init__(self, base_url: str, *, default_key: KeyProvider | None = None, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._default_key = default_key
        self._timeout = timeout_s
        self._keys: dict[str, KeyProvider] = {}
        self._sites: dict[str, tuple[web.AppRunner, Path]] = {}
        self._stats: dict[str, ProxyStats] = {}
        self._session: aiohttp.ClientSession | None = None

    def set_key_provider(self, sandbox_id: str, provider: KeyProvider | None) -> None:
        """The credential source for one sandbox (swapped in when a session claims it)."""
        if provider is None:
            self._keys.pop(sandbox_id, None)
        else:
            self._keys[sandbox_id] = provider

    def stats(self, sandbox_id: str) -> ProxyStats:
        return self._stats.setdefault(sandbox_id, ProxyStats())

    async def start_for(self, sandbox_id: str, socket_path: str | os.PathLike[str]) -> None:
        """Listen on `socket_path` for this sandbox. Idempotent per sandbox."""
        if sandbox_id in self._sites:
            return
        path = Path(socket_path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[_SANDBOX_ID] = sandbox_id
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        # The sandbox user must be able to connect; the socket lives in its private run dir.
        os.chmod(path, 0o666)  # noqa: S103
        self._sites[sandbox_id] = (runner, path)
        self._stats.setdefault(sandbox_id, ProxyStats())

    async def stop_for(self, sandbox_id: str) -> None:
        entry = self._sites.pop(sandbox_id, None)
        self._keys.pop(sandbox_id, None)
        self._stats.pop(sandbox_id, None)
        if entry is None:
            return
        runner, path = entry
        await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    async def close(self) -> None:
        for sandbox_id in list(self._sites):
            await self.stop_for(sandbox_id)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _key(self, sandbox_id: str) -> str | None:
        provider = self._keys.get(sandbox_id) or self._default_key
        if provider is None:
            return None
        value = provider()
        if inspect.isawaitable(value):
            value = await value
        return value or None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self._timeout),
                auto_decompress=False,
            )
        return self._session

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sandbox_id = request.app[_SANDBOX_ID]
        stats = self.stats(sandbox_id)
        stats.requests += 1
        if request.path not in ALLOWED_PATHS:
            stats.errors += 1
            return _error(404, "not_found_error", f"the model proxy only forwards {sorted(ALLOWED_PATHS)}")
        if request.method != "POST":
            stats.errors += 1
            return _error(405, "invalid_request_error", "the model proxy only forwards POST")
        key = await self._key(sandbox_id)
        if not key:
            stats.errors += 1
            return _error(
                401,
                "authentication_error",
                "no API key for this session: set ANTHROPIC_API_KEY on the server or give the session a credential",
            )
        body = await request.read()
        stats.bytes_in += len(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        headers["x-api-key"] = key
        url = self.base_url + request.path_qs
        try:
            upstream = await self._client().post(url, data=body, headers=headers)
        except (TimeoutError, aiohttp.ClientError) as exc:
            stats.errors += 1
            log.warning("model proxy: upstream %s unreachable: %s", self.base_url, exc)
            return _error(502, "api_error", f"model proxy could not reach the model API: {type(exc).__name__}")
        async with upstream:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _DROP_RESPONSE:
                    resp.headers.add(name, value)
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    stats.bytes_out += len(chunk)
                    await resp.write(chunk)
            except ConnectionResetError:
                # The sandbox hung up (an interrupted query): stop reading upstream. Caught before
                # ClientError, since aiohttp's reset error is both.
                return resp
            except (TimeoutError, aiohttp.ClientError) as exc:
                stats.errors += 1
                log.warning("model proxy: upstream stream broke: %s", exc)
                return resp
            await resp.write_eof()
            return resp
