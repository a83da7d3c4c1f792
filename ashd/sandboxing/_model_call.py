"""One call through the model proxy: its request checked and read, its record built at the end."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ashd.sandboxing._model_meter import UsageMeter
from ashd.sandboxing._model_policy import Refusal
from ashd.sandboxing._model_records import ModelCallRecord

ENDPOINTS = {"/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens"}
MAX_MODEL_NAME = 255
BYTES_PER_INPUT_TOKEN = 4  # for the worst case of a call before the API has counted its input


def _invalid(message: str) -> Refusal:
    return Refusal(400, "invalid_request_error", "invalid", f"model proxy: {message}")


@dataclass
class ParsedRequest:
    model: str
    max_tokens: int | None
    stream: bool
    body: bytes  # what is forwarded: exactly the JSON the checks saw
    input_estimate: int


def parse_request(endpoint: str, raw: bytes) -> ParsedRequest | Refusal:
    """The body as the model API will read it. It is parsed once and forwarded re-serialised, so a
    body with, say, two `model` keys cannot show the proxy one model and the API another."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _invalid("the request body is not valid JSON")
    if not isinstance(value, dict):
        return _invalid("the request body must be a JSON object")
    model = value.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_NAME:
        return _invalid(f"`model` must be a model name (a string of 1 to {MAX_MODEL_NAME} characters)")
    max_tokens = value.get("max_tokens")
    if endpoint == "messages":
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return _invalid("`max_tokens` must be an integer >= 1")
    else:
        max_tokens = None
    try:
        body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # lone surrogates from \\ud800-style escapes: keep them escaped
        body = json.dumps(value, separators=(",", ":")).encode()
    except ValueError:
        return _invalid("the request body holds a value JSON cannot carry")
    return ParsedRequest(model, max_tokens, value.get("stream") is True, body,
                         len(body) // BYTES_PER_INPUT_TOKEN)


@dataclass
class CallRecord:
    """What one call collects on its way through, turned into a ModelCallRecord at the end."""

    session_id: str
    tenant: str
    agent_name: str
    sandbox_id: str
    endpoint: str
    query_id: str | None = None
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    status: int = 0
    outcome: str = "ok"
    reason: str | None = None
    detail: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    started: float = field(default_factory=time.monotonic)
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    first_byte: float | None = None
    ended: float | None = None

    @property
    def latency_ms(self) -> float:
        return ((self.ended or time.monotonic()) - self.started) * 1000

    def refused(self, refusal: Refusal, note: str = "") -> None:
        self.status, self.outcome, self.reason = refusal.status, "refused", refusal.reason
        self.detail = refusal.message + note
        self.ended = time.monotonic()

    def metered(self, meter: UsageMeter, status: int, gone: bool, broke: str | None) -> None:
        self.status = status
        self.usage = dict(meter.usage)
        if (gone or broke) and not meter.finished:
            self.usage["output_tokens"] = meter.estimated_output()
        if broke is not None:
            self.outcome, self.reason, self.detail = "error", "upstream_broke", broke
        elif status >= 400 or meter.error_type is not None:
            self.outcome, self.reason, self.detail = "error", meter.error_type or f"http_{status}", meter.error_message
        elif gone:
            self.outcome, self.reason = "aborted", "client_gone"
            self.detail = None if meter.finished else "the sandbox hung up; output tokens estimated"
        if meter.overflow:
            self.detail = (self.detail or "") + " (reply too large to meter)"
        self.ended = time.monotonic()

    def to_record(self, server: str) -> ModelCallRecord:
        u = self.usage
        return ModelCallRecord(
            id=str(uuid.uuid4()), session_id=self.session_id, tenant=self.tenant, agent_name=self.agent_name,
            sandbox_id=self.sandbox_id, query_id=self.query_id, endpoint=self.endpoint, model=self.model,
            stream=self.stream, max_tokens=self.max_tokens, status=self.status, outcome=self.outcome,
            reason=self.reason, detail=(self.detail or None) and self.detail[:1000],
            input_tokens=u.get("input_tokens", 0), output_tokens=u.get("output_tokens", 0),
            cache_creation_tokens=u.get("cache_creation_input_tokens", 0),
            cache_read_tokens=u.get("cache_read_input_tokens", 0), cost_usd=self.cost_usd,
            latency_ms=self.latency_ms,
            first_byte_ms=None if self.first_byte is None else (self.first_byte - self.started) * 1000,
            created_at=self.created_at, server=server)


def metrics_usage(usage: dict[str, Any]) -> dict[str, int]:
    return {"input": int(usage.get("input_tokens", 0)), "output": int(usage.get("output_tokens", 0)),
            "cache_creation": int(usage.get("cache_creation_input_tokens", 0)),
            "cache_read": int(usage.get("cache_read_input_tokens", 0))}
