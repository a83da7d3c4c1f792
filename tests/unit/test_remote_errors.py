"""A runner's answers become the coordinator's ApiErrors: same status and message, except the two
that mean something else one hop further (a secret mismatch, a draining runner)."""

from __future__ import annotations

import json

from ashd.backends import DRAINING_HEADER, FULL_HEADER, RunnerDidNotTake, RunnerUnreachable
from ashd.backends._remote import _error
from ashd.errors import Gone, NotFound, ServiceError, Unavailable


def body(message: str, status: int) -> bytes:
    return json.dumps({"error": message, "statusCode": status}).encode()


def test_status_and_message_pass_through() -> None:
    exc = _error("r1", 404, body("Session x not found", 404), {})
    assert isinstance(exc, NotFound) and exc.message == "Session x not found"
    assert isinstance(_error("r1", 410, body("ended", 410), {}), Gone)
    odd = _error("r1", 418, body("teapot", 418), {})
    assert odd.status_code == 418 and odd.message == "teapot"
    full = _error("r1", 503, body("capacity reached", 503), {"Retry-After": "5"})
    assert isinstance(full, Unavailable) and not isinstance(full, RunnerUnreachable)
    assert full.headers == {"Retry-After": "5"}


def test_a_secret_mismatch_is_not_the_clients_401() -> None:
    exc = _error("r1", 401, body("bad secret", 401), {})
    assert exc.status_code == 502 and "r1" in exc.message and "SERVICE_INTERNAL_SECRET" in exc.message


def test_a_draining_runner_is_one_to_pass_over() -> None:
    exc = _error("r1", 503, body("runner r1 is shutting down", 503), {DRAINING_HEADER: "1"})
    assert isinstance(exc, RunnerDidNotTake) and isinstance(exc, RunnerUnreachable)


def test_a_runner_full_at_the_door_is_one_to_pass_over() -> None:
    exc = _error("r1", 503, body("Sandbox capacity reached on runner r1", 503), {FULL_HEADER: "1"})
    assert isinstance(exc, RunnerDidNotTake) and exc.message == "Sandbox capacity reached on runner r1"


def test_a_body_that_is_not_an_api_error_still_says_something() -> None:
    exc = _error("r1", 502, b"<html>bad gateway</html>", {})
    assert isinstance(exc, ServiceError) and exc.status_code == 502 and "bad gateway" in exc.message
