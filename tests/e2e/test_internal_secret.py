"""The internal endpoints of a real `ashd serve` started as a new user would (no
SERVICE_INTERNAL_SECRET): never open, guarded by a secret generated into the data dir."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.e2e.test_serve_process import free_port, http, start, stop

ATTACKS = [
    ("POST", "/api/internal/api-keys", {"tenantId": "default"}),
    ("POST", "/api/internal/api-keys", {"tenantId": "acme", "label": "stolen"}),
    ("GET", "/api/internal/runners", None),
    ("POST", "/api/internal/runners/register", {"runnerId": "evil", "host": "10.9.9.9", "port": 4200}),
    ("POST", "/api/internal/runners/heartbeat", {"runnerId": "evil", "stats": {}, "activeCount": 0}),
    ("POST", "/api/internal/runners/deregister", {"runnerId": "evil"}),
]


def test_internal_endpoints_need_the_generated_secret(short_tmp: Path) -> None:
    data, port = short_tmp / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(data, port)  # the quick start: no SERVICE_INTERNAL_SECRET
    try:
        api_key = (data / "initial-api-key").read_text().strip()
        for method, path, body in ATTACKS:
            for key in (None, api_key, "wrong-secret"):  # no header, an API key, a guess
                status, reply = http(method, base + path, key, body)
                assert status == 401, (method, path, key, reply)
                assert reply["statusCode"] == 401 and reply["error"] in (
                    "Missing Authorization header", "Invalid internal secret"), reply

        secret_file = data / "internal-secret"
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        secret = secret_file.read_text().strip()
        assert len(secret) >= 32 and secret != api_key
        status, reply = http("POST", base + "/api/internal/api-keys", secret, {"tenantId": "acme"})
        assert status == 201 and reply["tenantId"] == "acme", reply
        status, reply = http("GET", base + "/api/internal/runners", secret)
        assert status == 200 and reply["count"] == 0  # the attacker's runner was never registered
    finally:
        log = stop(proc)
    assert secret not in log  # the generated secret never reaches the log stream

    proc = start(data, port)  # a restart keeps the same secret
    try:
        assert secret_file.read_text().strip() == secret
        assert http("GET", base + "/api/internal/runners", secret)[0] == 200
        assert http("GET", base + "/api/internal/runners")[0] == 401
    finally:
        stop(proc)


def test_operator_secret_wins_and_is_never_written(short_tmp: Path) -> None:
    data, port = short_tmp / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    chosen = "operator-chosen-internal-secret-0123456789"
    proc = start(data, port, SERVICE_INTERNAL_SECRET=chosen)
    try:
        assert not (data / "internal-secret").exists()
        assert http("GET", base + "/api/internal/runners", chosen)[0] == 200
        assert http("GET", base + "/api/internal/runners", "x" * 40)[0] == 401
    finally:
        log = stop(proc)
    assert chosen not in log
