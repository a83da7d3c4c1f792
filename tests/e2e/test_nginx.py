"""configs/nginx-ashd.conf as shipped passes `nginx -t`, and real nginx with it in front of a real
`ashd serve` passes a turn's stream unbuffered (a frame arrives while the turn is still running),
the 15 s `: ping` comments of a long tool call, and the replay of a stream after Last-Event-ID."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path

import pytest

from tests.e2e.test_cli import Server, server  # noqa: F401  (fixture)
from tests.e2e.test_serve_process import fake_model_process, free_port, http, wait_http  # noqa: F401
from tests.fixtures.nginx import main_conf
from tests.fixtures.tools import tool

CONF = Path(__file__).resolve().parents[2] / "configs" / "nginx-ashd.conf"
CLUSTER_CONF = CONF.parent / "cluster" / "nginx.conf"  # two coordinators (tests/e2e/test_cluster.py)


def nginx_dir(root: Path, conf: str) -> Path:
    root.mkdir()
    (root / "ashd.conf").write_text(conf)
    (root / "nginx.conf").write_text(main_conf(root, worker_connections=64))
    return root


def nginx(root: Path, *args: str) -> list[str]:
    return [tool("nginx"), "-p", str(root), "-e", str(root / "error.log"), "-c", str(root / "nginx.conf"), *args]


@pytest.mark.parametrize("conf", [CONF, CLUSTER_CONF], ids=["standalone", "cluster"])
def test_the_shipped_config_passes_nginx_t(tmp_path: Path, conf: Path) -> None:
    root = nginx_dir(tmp_path / "nginx", conf.read_text())
    result = subprocess.run(nginx(root, "-t"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


@pytest.fixture
def proxy(server: Server, short_tmp: Path) -> Iterator[str]:  # noqa: F811
    port, ashd_port = free_port(), server.url.rsplit(":", 1)[1]
    conf = CONF.read_text().replace("127.0.0.1:4100", f"127.0.0.1:{ashd_port}")
    conf = conf.replace("listen 80;", f"listen 127.0.0.1:{port};")
    root = nginx_dir(short_tmp / "nginx", conf)
    proc = subprocess.Popen(nginx(root), stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def fake_requests(server: Server, token: str) -> int:  # noqa: F811
    with urllib.request.urlopen(f"{server.model}/_fake/requests?contains={token}", timeout=30) as resp:
        return len(json.loads(resp.read())["requests"])


def sse_lines(resp: HTTPResponse) -> Iterator[str]:
    while line := resp.readline():
        yield line.decode().rstrip("\n")


@pytest.mark.sandbox
def test_streams_pings_and_replay_through_nginx(server: Server, proxy: str) -> None:  # noqa: F811
    base = f"http://{proxy}"
    status, body = http("POST", f"{base}/api/agents", server.key, {"name": "slow", "systemPrompt": "Be slow."})
    assert status == 201, body
    status, body = http("POST", f"{base}/api/sessions", server.key, {"agent": "slow"})
    assert status == 201, body
    sid = body["session"]["id"]
    # A tool call that outlasts ashd's 15 s ping interval, between two texts.
    server.script("tok-nginx", [
        {"content": [{"type": "text", "text": "working"},
                     {"type": "tool_use", "name": "Bash", "input": {"command": "sleep 17"}}]},
        {"content": [{"type": "text", "text": "finished"}]},
    ])
    conn = HTTPConnection(proxy, timeout=120)
    conn.request("POST", f"/api/sessions/{sid}/messages", json.dumps({"content": "go tok-nginx"}),
                 {"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream")
    seen: list[str] = []
    ids: list[int] = []
    model_calls_when_working = None
    for line in sse_lines(resp):
        if line.startswith("id: "):
            ids.append(int(line[4:]))
        if line.startswith(":"):
            seen.append("ping")
        elif line.startswith("data: ") and '"working"' in line and "working" not in seen:
            seen.append("working")
            # Delivered while the tool still sleeps: the model has not been asked for the next step.
            model_calls_when_working = fake_requests(server, "tok-nginx")
        elif line.startswith("data: ") and '"finished"' in line and "finished" not in seen:
            seen.append("finished")
        elif line == "event: done":
            seen.append("done")
    conn.close()
    assert model_calls_when_working == 1, "nginx held the stream back until the turn ended"
    assert seen.index("working") < seen.index("ping") < seen.index("finished") < seen.index("done"), seen
    assert fake_requests(server, "tok-nginx") == 2

    # Replay: everything after the first frame's id, through the proxy, ending with `done`.
    conn = HTTPConnection(proxy, timeout=120)
    conn.request("GET", f"/api/sessions/{sid}/stream",
                 headers={"Authorization": f"Bearer {server.key}", "Last-Event-ID": str(ids[0])})
    resp = conn.getresponse()
    assert resp.status == 200
    replayed = [int(line[4:]) for line in sse_lines(resp) if line.startswith("id: ")]
    conn.close()
    assert replayed == ids[1:]
