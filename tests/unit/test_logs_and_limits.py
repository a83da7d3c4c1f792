"""Log redaction and JSON shape; the rate limiter's token bucket."""

from __future__ import annotations

import io
import json
import logging

from ashd.http._ratelimit import RateLimiter
from ashd.logs import emit_line, redact, setup_logging


def test_secrets_are_redacted() -> None:
    text = redact("key sk-ant-api03-abcdefghijkl and Bearer ashd_abcdefghijklmnop and ashd_xyzw123456789")
    assert "abcdefghijkl" not in text and "ijklmnop" not in text and "123456789" not in text
    assert "***" in text


def test_json_lines_with_context() -> None:
    stream = io.StringIO()
    setup_logging("info", stream)
    logging.getLogger("ashd.test").info("session created", extra={"sessionId": "s1", "count": 2})
    logging.getLogger("ashd.test").debug("hidden")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 1
    assert lines[0]["level"] == "info" and lines[0]["sessionId"] == "s1" and lines[0]["count"] == 2
    setup_logging("warning")


def test_operational_lines_are_exact() -> None:
    stream = io.StringIO()
    emit_line({"type": "resume_hit", "path": "warm"}, stream)
    assert json.loads(stream.getvalue()) == {"type": "resume_hit", "path": "warm"}


def test_token_bucket() -> None:
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.take("k", now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.take("k", now=0.0)
    assert 0.4 < wait <= 0.5
    assert limiter.take("k", now=0.5) == 0.0  # refilled one token in 0.5 s
    assert limiter.take("other", now=0.0) == 0.0  # buckets are per key
    assert RateLimiter.retry_after(0.2) == "1"
