"""One model call: a streamed Messages API request, assembled into an API message, with retries.

The client (`_model_client.py`) talks plain HTTP over the model socket to the server's model proxy,
which adds the real API key; the sandbox never holds one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ashd.bridge.engine._model_client import ApiConnectionError, ApiError, ApiStatusError, ApiTimeoutError
from ashd.bridge.engine._model_client import ModelClient as ModelClient
from ashd.bridge.engine._model_client import make_client as make_client

log = logging.getLogger(__name__)

MAX_RETRIES = 3
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 20.0
REFUSAL_HEADER = "x-ashd-refusal"  # set by the model proxy on its own refusals (sandboxing/_model_policy.py)
REFUSAL_RETRY_MAX_S = 10.0
_RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]


class ModelError(Exception):
    """A model call failed for good; the message is meant for a person. `refusal` names the model
    proxy's reason when the server refused the call (`turn_budget`: the message's maxBudgetUsd)."""

    def __init__(self, message: str, refusal: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class PromptTooLong(ModelError):
    """The API refused the request because the conversation no longer fits the model's context
    window (400 invalid_request_error, "prompt is too long"): compacting it is the cure."""


def _is_prompt_too_long(exc: Exception) -> bool:
    if not isinstance(exc, ApiStatusError) or exc.status_code not in (400, 413):
        return False
    if exc.headers.get(REFUSAL_HEADER):
        return False  # the server's own refusal (a max_tokens cap, say), not the model's window
    return "prompt is too long" in _describe(exc).lower()


@dataclass
class CallResult:
    message: dict[str, Any]
    api_ms: float


class _Assembler:
    """Builds the final API message from raw stream events."""

    # Deltas are collected in lists and joined at content_block_stop: concatenating each small
    # delta onto a growing string would be quadratic for long outputs.
    _FIELDS = {
        "text_delta": ("text", "text"),
        "input_json_delta": ("partial_json", "_json"),
        "thinking_delta": ("thinking", "thinking"),
        "signature_delta": ("signature", "signature"),
    }

    def __init__(self, on_event: OnEvent | None = None) -> None:
        self.message: dict[str, Any] = {}
        self._parts: dict[tuple[int, str], list[str]] = {}
        self._on_event = on_event
        self.emitted = False  # an event went on to `on_event`: the call can no longer be retried

    async def handle(self, ev: dict[str, Any]) -> None:
        self.feed(ev)
        if self._on_event is not None:
            self.emitted = True
            await self._on_event(ev)

    def feed(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "message_start":
            self.message = dict(ev["message"])
            self.message["content"] = []
        elif kind == "content_block_start":
            self.message["content"].append(dict(ev["content_block"]))
        elif kind == "content_block_delta":
            delta = ev["delta"]
            spec = self._FIELDS.get(str(delta.get("type")))
            if spec is not None:
                self._parts.setdefault((ev["index"], spec[1]), []).append(delta[spec[0]])
        elif kind == "content_block_stop":
            idx = ev["index"]
            block = self.message["content"][idx]
            for (part_idx, name), pieces in list(self._parts.items()):
                if part_idx != idx:
                    continue
                del self._parts[(part_idx, name)]
                joined = "".join(pieces)
                if name == "_json":
                    block["input"] = json.loads(joined) if joined.strip() else {}
                else:
                    block[name] = block.get(name, "") + joined
        elif kind == "message_delta":
            self.message.update({k: v for k, v in ev.get("delta", {}).items() if k in ("stop_reason", "stop_sequence")})
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage


def _retry_after(exc: ApiStatusError) -> float | None:
    value = exc.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiStatusError):
        body = exc.body
        detail = body.get("error", {}).get("message") if isinstance(body, dict) else None
        return str(detail or exc.message)
    return str(exc) or type(exc).__name__


def _final_error(exc: Exception, attempts: int) -> ModelError:
    retried = f" after {attempts - 1} retries" if attempts > 1 else ""
    if _is_prompt_too_long(exc):
        return PromptTooLong(f"the conversation does not fit the model's context window: {_describe(exc)}")
    if isinstance(exc, ApiStatusError):
        status = exc.status_code
        if exc.headers.get(REFUSAL_HEADER):
            # The server's model proxy refused the call (policy, budget, rate): its message says what
            # to do, so it is passed on as it is instead of being read as the model API's words.
            return ModelError(f"model call refused by the server ({status}){retried}: {_describe(exc)}",
                              refusal=exc.headers.get(REFUSAL_HEADER))
        if status == 401:
            return ModelError("model API rejected the API key (401): check the session credential or ANTHROPIC_API_KEY")
        label = {
            429: "rate limited",
            529: "overloaded",
            403: "refused the request (permission denied)",
            404: "does not know this model or endpoint",
            400: "rejected the request as invalid",
            413: "rejected the request as too large",
        }.get(status, "failed" if status >= 500 else "rejected the request")
        return ModelError(f"model API {label} ({status}){retried}: {_describe(exc)}")
    if isinstance(exc, ApiTimeoutError):
        return ModelError(f"model API timed out{retried}: the model proxy did not answer in time")
    if isinstance(exc, ApiConnectionError):
        return ModelError(f"could not reach the model API{retried}: {_describe(exc)}")
    return ModelError(f"model API call failed{retried}: {_describe(exc)}")


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, ApiStatusError):
        if exc.headers.get(REFUSAL_HEADER):
            # The server's own refusals: a short rate wait or a spend that could not be read (503) is
            # worth retrying; a budget or a model refusal will not change, and a long wait is better
            # told to the person at once.
            if exc.status_code == 503:
                return True
            hinted = _retry_after(exc)
            return exc.status_code == 429 and hinted is not None and hinted <= REFUSAL_RETRY_MAX_S
        return exc.status_code in _RETRY_STATUSES or exc.status_code >= 500
    return isinstance(exc, ApiConnectionError)


async def call_model(
    client: ModelClient,
    params: dict[str, Any],
    *,
    betas: list[str],
    on_event: OnEvent | None,
    max_retries: int = MAX_RETRIES,
) -> CallResult:
    """Stream one request; `on_event` gets each raw event dict (for stream_event messages)."""
    attempt = 0
    while True:
        attempt += 1
        started = time.monotonic()
        asm = _Assembler(on_event)
        try:
            await client.stream(params, betas, asm.handle)
            if not asm.message:
                raise ModelError("model API returned an empty stream (no message_start)")
            return CallResult(asm.message, (time.monotonic() - started) * 1000)
        except ApiError as exc:
            # Events already forwarded cannot be taken back: retry only clean failures.
            if attempt > max_retries or asm.emitted or not _retryable(exc):
                raise _final_error(exc, attempt) from exc
            delay = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
            if isinstance(exc, ApiStatusError):
                hinted = _retry_after(exc)
                delay = min(hinted, BACKOFF_MAX_S * 3) if hinted is not None else delay
            log.warning("model call failed (%s); retry %d/%d in %.1fs", _describe(exc), attempt, max_retries, delay)
            await asyncio.sleep(delay)
