"""A bounded schemathesis run against a real `ashd serve`: for every operation of the OpenAPI
document, generated requests get no 5xx, and every response agrees with the document (status code,
content type, body schema). Positive and negative data, derandomized, a few examples each."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.test_serve_process import free_port, start, stop

# Valid requests: no 5xx, and the answer is what the document says. Invalid ones (a wrong type, a
# value out of bounds, an unknown field): no 5xx, and a 4xx.
POSITIVE = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
NEGATIVE = [not_a_server_error, negative_data_rejection, content_type_conformance]
EXAMPLES = 6  # per operation: the run stays within a minute or two on two cores


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="ashd-", dir="/tmp"))
    port = free_port()
    # Generated traffic is fast: the per-key rate limit would turn it into 429s.
    proc = start(tmp / "data", port, SERVICE_RATE_LIMIT_RPS="100000", SERVICE_RATE_LIMIT_BURST="100000",
                 SERVICE_PREWARM="0")
    try:
        yield f"http://127.0.0.1:{port}", (tmp / "data" / "initial-api-key").read_text().strip(), \
            (tmp / "data" / "internal-secret").read_text().strip()
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def fuzz(operation: Any, mode: GenerationMode, base: str, key: str, secret: str) -> None:
    """Hypothesis examples of one operation in one mode; raises schemathesis's failures."""
    checks = POSITIVE if mode is GenerationMode.POSITIVE else NEGATIVE

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        token = secret if case.path.startswith("/api/internal/") else key
        response = case.call(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        case.validate_response(response, checks=checks)

    run()


def test_no_server_errors_and_responses_match_the_document(served: tuple[str, str, str]) -> None:
    base, key, secret = served
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    failures: list[str] = []
    no_negative: list[str] = []
    runs = 0
    for result, mode in itertools.product(schema.get_all_operations(), GenerationMode):
        operation = result.ok()
        runs += 1
        try:
            fuzz(operation, mode, base, key, secret)
        except Unsatisfiable:
            # Nothing can be invalid about it (no parameters, or a free-form string path segment).
            assert mode is GenerationMode.NEGATIVE, operation.label
            no_negative.append(operation.label)
        except BaseException as exc:  # schemathesis's FailureGroup; every operation runs, failures come together
            if isinstance(exc, KeyboardInterrupt):
                raise
            failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert runs >= 80  # both modes of every operation
    assert set(no_negative) <= {"GET /health", "GET /metrics", "GET /docs", "GET /docs/assets/{file}",
                                "GET /openapi.json"}, no_negative
    assert not failures, "\n\n".join(failures)
