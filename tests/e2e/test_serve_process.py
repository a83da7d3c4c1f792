"""`ashd serve` as a real process: first start, key file, graceful SIGTERM, restart reuses everything."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.databases import PG_URL  # noqa: F401  (documents where PostgreSQL comes from)
from tests.fixtures.forward_proxy import forward_proxy_thread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


_LOGS: dict[int, Path] = {}  # a started server's pid: the file its stderr (the JSON log) goes to


def start(data_dir: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    """`ashd serve` answering /health. Its log goes to a file beside its data directory, not a pipe:
    a pipe nobody reads blocks a chatty server, and the file outlives a failure for `server_log`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    full.update({"SERVICE_DATA_DIR": str(data_dir), "SERVICE_PORT": str(port), "SERVICE_HOST": "127.0.0.1",
                 "SERVICE_PREWARM": "1", **env})
    log = data_dir.parent / f"serve-{port}-{time.monotonic_ns()}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ashd", "serve"], env=full, stderr=sink)
    _LOGS[proc.pid] = log
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, server_log(proc)
        try:
            if http("GET", f"http://127.0.0.1:{port}/health")[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"server did not answer /health\n{server_log(proc)}")


def server_log(proc: subprocess.Popen[bytes], tail: int = 20_000) -> str:
    """What a server started by `start` has logged so far (its last `tail` characters), and whether
    it has exited: what a failing test shows about the server it talked to."""
    text = _LOGS[proc.pid].read_text(errors="replace")[-tail:]
    status = "running" if proc.poll() is None else f"exited with {proc.returncode}"
    return f"--- ashd serve (pid {proc.pid}, {status}) log ---\n{text}"


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    log = _LOGS.pop(proc.pid).read_text(errors="replace")
    assert proc.returncode == 0, log
    return log


def test_first_start_sigterm_and_restart(short_tmp: Path) -> None:
    data, port = short_tmp / "data", free_port()
    proc = start(data, port)
    key_file = data / "initial-api-key"
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    status, body = http("POST", f"http://127.0.0.1:{port}/api/agents", key, {"name": "a", "systemPrompt": "hi"})
    assert status == 201, body
    status, health = http("GET", f"http://127.0.0.1:{port}/health")
    assert health["status"] == "ok" and health["isolation"]["weak"] is False
    log = stop(proc)
    assert key not in log  # the key never reaches the log stream
    for line in log.splitlines():
        json.loads(line)  # every log line is JSON
    # nothing left behind: no sandbox processes, no sandbox dirs
    assert not any(p.name.startswith("sb-") for p in (data / "sandboxes").glob("*"))

    proc = start(data, port)
    try:
        assert key_file.read_text().strip() == key
        status, body = http("GET", f"http://127.0.0.1:{port}/api/agents/a", key)
        assert status == 200 and body["agent"]["version"] == 1
    finally:
        stop(proc)


def test_bad_configuration_stops_the_start_with_a_clear_message(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update({"SERVICE_DATA_DIR": str(short_tmp / "d"), "SERVICE_PORT": "not-a-port"})
    result = subprocess.run([sys.executable, "-m", "ashd", "serve"], env=env, capture_output=True, timeout=60)
    assert result.returncode == 2
    assert b"SERVICE_PORT" in result.stderr and b"port" in result.stderr


@pytest.mark.parametrize("flag", ["--version"])
def test_cli_entry_points(flag: str) -> None:
    result = subprocess.run([sys.executable, "-m", "ashd", flag], capture_output=True, timeout=60)
    assert result.returncode == 0 and b"ashd" in result.stdout


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the process exited"
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer")


def stream(url: str, key: str, content: str) -> list[str]:
    """POST a message; the event names of the SSE stream, read as the reference CLI reads them."""
    req = urllib.request.Request(url, data=json.dumps({"content": content}).encode(), method="POST")
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read().decode()
    return [line[7:] for line in raw.split("\n") if line.startswith("event: ")]


@pytest.fixture
def fake_model_process() -> Any:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ashd.devtools.fake_model", "--port", str(port)],
                            stdout=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/_fake/scripts", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.sandbox
@pytest.mark.parametrize("zygote", ["0", "1"], ids=["bwrap", "zygote"])
def test_sessions_and_a_cold_resume_after_a_restart(short_tmp: Path, fake_model_process: str, zygote: str) -> None:
    """What the wheel-install bug broke: `ashd serve` as installed, an agent, a session, a turn; then a
    restart and a cold resume (snapshot restore) that continues the conversation, on each route."""
    data, port = short_tmp / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"SERVICE_ZYGOTE": zygote, "ANTHROPIC_BASE_URL": fake_model_process, "ANTHROPIC_API_KEY": "sk-ant-e2e"}
    proc = start(data, port, **env)
    try:
        key = (data / "initial-api-key").read_text().strip()
        status, body = http("POST", f"{base}/api/agents", key, {"name": "e2e", "files": [
            {"path": "AGENT.md", "content": "You are installed."}, {"path": "notes.txt", "content": "kept\n"}]})
        assert status == 201, body
        status, body = http("POST", f"{base}/api/sessions", key, {"agent": "e2e"})
        assert status == 201, body
        sid = body["session"]["id"]
        assert stream(f"{base}/api/sessions/{sid}/messages", key, "first-turn-e2e")[-1] == "done"
    finally:
        stop(proc)
    proc = start(data, port, **env)
    try:
        status, body = http("GET", f"{base}/api/sessions/{sid}", key)
        assert body["session"]["status"] == "paused"  # the restart paused it
        status, body = http("POST", f"{base}/api/sessions/{sid}/resume", key)
        assert status == 200 and body["session"]["status"] == "active", body
        events = stream(f"{base}/api/sessions/{sid}/messages", key, "second-turn-e2e")
        assert events[-1] == "done" and "error" not in events
        status, body = http("GET", f"{base}/api/sessions/{sid}/files/notes.txt?format=json", key)
        assert status == 200 and body["content"] == "kept\n", body
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
            assert 'ash_resume_total{path="cold"} 1.0' in resp.read().decode()
        with urllib.request.urlopen(f"{fake_model_process}/_fake/requests?contains=second-turn-e2e") as resp:
            sent = json.loads(resp.read())["requests"]
        assert "first-turn-e2e" in json.dumps(sent[0]["body"]["messages"])  # the history came back
    finally:
        stop(proc)


@pytest.mark.sandbox
def test_model_calls_go_through_the_operators_proxy(short_tmp: Path, fake_model_process: str) -> None:
    """HTTP_PROXY with credentials, as a host whose only way out is an egress proxy has it: a turn's
    model calls leave through it (the API's name resolves only there), and the credentials reach
    neither the API nor the log."""
    api = f"http://model-api.test:{fake_model_process.rsplit(':', 1)[1]}"
    auth = "Basic b3BzOnMzY3JldA=="  # ops:s3cret
    with forward_proxy_thread({"model-api.test": "127.0.0.1"}, require=auth) as egress:
        data, port = short_tmp / "data", free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start(data, port, ANTHROPIC_BASE_URL=api, ANTHROPIC_API_KEY="sk-ant-e2e",
                     HTTP_PROXY=f"http://ops:s3cret@127.0.0.1:{egress.port}", NO_PROXY="internal.corp")
        try:
            key = (data / "initial-api-key").read_text().strip()
            assert http("POST", f"{base}/api/agents", key, {"name": "egress", "systemPrompt": "hi"})[0] == 201
            status, body = http("POST", f"{base}/api/sessions", key, {"agent": "egress"})
            assert status == 201, body
            events = stream(f"{base}/api/sessions/{body['session']['id']}/messages", key, "egress-turn-e2e")
            assert events[-1] == "done" and "error" not in events, server_log(proc)
        finally:
            log = stop(proc)
    assert egress.seen and all(s.proxy_authorization == auth for s in egress.seen)
    assert all(s.request_line.startswith(f"POST {api}/v1/messages ") for s in egress.seen)
    assert f"reached through the proxy http://127.0.0.1:{egress.port} (HTTP_PROXY)" in log
    assert "s3cret" not in log
    with urllib.request.urlopen(f"{fake_model_process}/_fake/requests?contains=egress-turn-e2e") as resp:
        sent = json.loads(resp.read())["requests"]
    assert sent and not any(name.lower().startswith("proxy-") for r in sent for name in r["headers"])


def test_a_proxy_the_server_cannot_use_stops_the_start(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    env.update({"SERVICE_DATA_DIR": str(short_tmp / "d"), "SERVICE_PORT": str(free_port()),
                "ALL_PROXY": "socks5://ops:s3cret@egress.corp:1080"})
    result = subprocess.run([sys.executable, "-m", "ashd", "serve"], env=env, capture_output=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert b"configuration error: ALL_PROXY=" in result.stderr and b"NO_PROXY" in result.stderr
    assert b"s3cret" not in result.stderr
