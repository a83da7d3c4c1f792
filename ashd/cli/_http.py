"""The HTTP side of the CLI: one ashd server at --url/ASHD_URL, authenticated with --key/ASHD_KEY.

Every failure becomes a click error with a sentence a person can act on: the server's own ApiError
message when it answered, what could not be reached when it did not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
import httpx

DEFAULT_URL = "http://127.0.0.1:4100"


def api_error_text(response: httpx.Response) -> str:
    """The ApiError message of a failed response, or its status line when the body is not one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return f"{body['error']} (HTTP {response.status_code})"
    return f"HTTP {response.status_code} {response.reason_phrase} from {response.request.url}"


@dataclass
class Remote:
    url: str
    key: str | None
    timeout: float = 600.0  # creating a session waits for the agent's setup (npm install, setup.sh)

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        return httpx.Client(base_url=self.url.rstrip("/"), headers=headers,
                            timeout=httpx.Timeout(self.timeout, connect=10.0))

    def _fail_unreachable(self, exc: httpx.HTTPError) -> click.ClickException:
        return click.ClickException(
            f"cannot reach ashd at {self.url}: {exc}. Is `ashd serve` running there? "
            "(set --url or ASHD_URL)")

    def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        try:
            with self._client() as client:
                response = client.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise self._fail_unreachable(exc) from exc
        if response.status_code == 401 and not self.key:
            raise click.ClickException(
                "this needs an API key: pass --key or set ASHD_KEY (the first one is in "
                "<data dir>/initial-api-key; `ashd keys create` mints more)")
        if response.status_code >= 400:
            raise click.ClickException(api_error_text(response))
        content_type = response.headers.get("content-type", "")
        return response.json() if "json" in content_type else response.content

    def stream(self, path: str, body: Any) -> Iterator[tuple[str, Any]]:
        """POST `body` and yield the (event, data) frames of the SSE reply as they arrive."""
        try:
            with self._client() as client, client.stream("POST", path, json=body,
                                                         headers={"Accept": "text/event-stream"}) as response:
                if response.status_code >= 400:
                    response.read()
                    raise click.ClickException(api_error_text(response))
                yield from parse_sse(response.iter_lines())
        except httpx.HTTPError as exc:
            raise self._fail_unreachable(exc) from exc


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    event = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                raw = "\n".join(data)
                try:
                    yield event, json.loads(raw)
                except ValueError:
                    yield event, raw
            event, data = "message", []
        elif line.startswith(":"):
            continue  # a keep-alive comment
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
