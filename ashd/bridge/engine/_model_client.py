"""The bridge's client of the Messages API: one streamed `POST /v1/messages`, its SSE events as dicts.

The engine needs one request shape and the raw events. The anthropic SDK built each request's
parameters through its type transforms and each event into a pydantic model that the engine turned
back into a dict: 0.89 ms of a model call against 0.21 ms for the same request and events here
(measured in process, 10 messages and 10 tools, 13 events), and pages of code and validators that
every sandbox's bridge touched on its turns. The errors keep what the engine decides on: the HTTP
status, the headers (the model proxy's refusal, `retry-after`) and the API's error body.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]
API_VERSION = "2023-06-01"
DEFAULT_TIMEOUT = httpx2.Timeout(600.0, connect=10.0)


def _unused_tls() -> ssl.SSLContext:
    """The model socket is plain HTTP, but a transport builds an SSL context all the same (1.1 ms of
    a fresh bridge's first model call): this one is built once, when the fork server imports this
    module, and never loads a certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


_PLAIN_HTTP = _unused_tls()

# An `error` event inside a 200 stream names its type, not a status: the status the API gives the same
# error as a response, so the retry rules read both alike.
_STATUS_OF_ERROR = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403, "not_found_error": 404,
    "request_too_large": 413, "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529,
}


class ApiError(Exception):
    """A model call that failed; `message` is the reason for people."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiConnectionError(ApiError):
    """The model proxy could not be reached, or the connection broke."""


class ApiTimeoutError(ApiConnectionError):
    """The model proxy did not answer in time."""


class ApiStatusError(ApiError):
    """The API (or the model proxy) answered with an error: `status`, its `headers`, and `body` (the
    parsed JSON error, else None)."""

    def __init__(self, message: str, status: int, headers: httpx2.Headers, body: Any) -> None:
        super().__init__(message)
        self.status_code = status
        self.headers = headers
        self.body = body


def _status_error(status: int, headers: httpx2.Headers, raw: bytes) -> ApiStatusError:
    text = raw.decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return ApiStatusError(f"Error code: {status} - {body if body is not None else text}", status, headers, body)


class ModelClient:
    """Streams Messages API requests through `http` to `base_url` (the model proxy)."""

    def __init__(self, http: httpx2.AsyncClient, base_url: str = "http://model-proxy") -> None:
        self._http = http
        self._url = base_url.rstrip("/") + "/v1/messages"

    async def stream(self, params: dict[str, Any], betas: list[str],
                     on_event: OnEvent) -> None:
        """Send `params` as a streamed request; `on_event` gets each event (`ping` left out) in order.
        An `error` event ends the stream with an `ApiStatusError`."""
        # The model proxy replaces the key with the session's real credential.
        headers = {"content-type": "application/json", "accept": "text/event-stream",
                   "anthropic-version": API_VERSION, "x-api-key": "sandbox-no-key"}
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
        body = json.dumps({**params, "stream": True}, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            async with self._http.stream("POST", self._url, content=body, headers=headers) as resp:
                if resp.status_code >= 300:
                    raise _status_error(resp.status_code, resp.headers, await resp.aread())
                await _read_events(resp, on_event)
        except httpx2.TimeoutException as exc:
            raise ApiTimeoutError(f"Request timed out: {exc}") from exc
        except httpx2.TransportError as exc:
            raise ApiConnectionError(f"Connection error: {exc}" if str(exc) else "Connection error.") from exc

    async def close(self) -> None:
        await self._http.aclose()


async def _read_events(resp: httpx2.Response, on_event: OnEvent) -> None:
    """Server-sent events: `data:` lines (joined by newlines) end at a blank line; `event:` names it."""
    event = ""
    data: list[str] = []
    async for line in resp.aiter_lines():
        if line:
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            continue
        if data:
            await _dispatch(event, "\n".join(data), resp, on_event)
        event, data = "", []
    if data:
        await _dispatch(event, "\n".join(data), resp, on_event)


async def _dispatch(event: str, data: str, resp: httpx2.Response,
                    on_event: OnEvent) -> None:
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise ApiError(f"the model stream sent an event that is not JSON: {data[:200]!r}") from exc
    kind = event or (parsed.get("type") if isinstance(parsed, dict) else None)
    if kind == "ping":
        return
    if kind == "error" or (isinstance(parsed, dict) and parsed.get("type") == "error"):
        error = parsed.get("error") if isinstance(parsed, dict) else None
        status = _STATUS_OF_ERROR.get(str(error.get("type")) if isinstance(error, dict) else "", 500)
        raise ApiStatusError(f"Error in the model stream: {parsed}", status, resp.headers, parsed)
    if not isinstance(parsed, dict):
        raise ApiError(f"the model stream sent an event that is not an object: {data[:200]!r}")
    await on_event(parsed)


def make_client(model_socket: str | None, base_url: str = "http://model-proxy") -> ModelClient:
    if model_socket:
        # Plain HTTP over the model proxy's unix socket: no TLS, so no certificate store to load (the
        # default one costs ~30 ms, paid by a session's first message), and no proxy from the env.
        transport = httpx2.AsyncHTTPTransport(uds=model_socket, verify=_PLAIN_HTTP, trust_env=False)
        http = httpx2.AsyncClient(transport=transport, timeout=DEFAULT_TIMEOUT, verify=_PLAIN_HTTP, trust_env=False)
    else:
        http = httpx2.AsyncClient(timeout=DEFAULT_TIMEOUT)
    return ModelClient(http, base_url)
