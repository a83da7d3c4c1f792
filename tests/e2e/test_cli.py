"""The `ashd` command against a real `ashd serve` process and the fake model: every remote command,
the local key commands and their data-directory guard, and `ashd chat` typed into a real terminal
(tmux), whose screen is kept as a text recording."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_serve_process import fake_model_process, free_port, http, server_log, start, stop  # noqa: F401
from tests.fixtures.tools import tool

ASHD = [sys.executable, "-m", "ashd"]


@dataclass
class Server:
    url: str
    key: str
    data: Path
    model: str
    proc: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVICE_", "ASHD_"))}
        return {**env, "ASHD_URL": self.url, "ASHD_KEY": self.key}

    def script(self, token: str, turns: list[dict[str, Any]]) -> None:
        req = urllib.request.Request(f"{self.model}/_fake/scripts", method="POST",
                                     data=json.dumps({"match": token, "turns": turns}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).close()


@pytest.fixture
def server(short_tmp: Path, fake_model_process: str) -> Iterator[Server]:  # noqa: F811
    data, port = short_tmp / "data", free_port()
    proc = start(data, port, ANTHROPIC_BASE_URL=fake_model_process, ANTHROPIC_API_KEY="sk-ant-cli")
    try:
        key = (data / "initial-api-key").read_text().strip()
        yield Server(f"http://127.0.0.1:{port}", key, data, fake_model_process, proc)
    finally:
        stop(proc)


def ashd(server: Server | None, *args: str, ok: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = server.env() if server else {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
    result = subprocess.run([*ASHD, *args], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)
    if ok:
        assert result.returncode == 0, (args, result.stdout, result.stderr, server_log(server.proc) if server else "")
    return result


def test_keys_refuse_a_directory_without_the_servers_database(short_tmp: Path) -> None:
    result = ashd(None, "keys", "create", ok=False, cwd=short_tmp)
    assert result.returncode == 1
    assert "no ashd database" in result.stderr and "--data-dir" in result.stderr
    assert not (short_tmp / "data").exists()  # nothing created


def test_a_taken_port_is_one_clear_line(short_tmp: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICE_")}
        env.update({"SERVICE_DATA_DIR": str(short_tmp / "data"), "SERVICE_HOST": "127.0.0.1",
                    "SERVICE_PORT": str(port)})
        result = subprocess.run([*ASHD, "serve"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"port {port}" in lines[0] and "already in use" in lines[0] and "SERVICE_PORT" in lines[0]


def test_output_into_a_closed_pipe_is_quiet() -> None:
    """`ashd config | head -1`: the reader leaves early; no BrokenPipeError traceback."""
    proc = subprocess.Popen([*ASHD, "config"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


TOOL_TURNS: list[dict[str, Any]] = [
    {"content": [{"type": "text", "text": "Creating the file."},
                 {"type": "tool_use", "name": "Write", "input": {"file_path": "hello.txt", "content": "hi from cli"}}]},
    {"content": [{"type": "text", "text": "Done: hello.txt written."}]},
]


@pytest.mark.sandbox
def test_remote_commands_and_local_keys(server: Server, short_tmp: Path) -> None:
    folder = short_tmp / "helper"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You are a helpful agent.")
    (folder / "notes.txt").write_bytes(b"\x00binary\xff")
    assert "deployed helper version 1" in ashd(server, "agents", "deploy", str(folder)).stdout
    assert [a["name"] for a in json.loads(ashd(server, "agents", "list", "--json").stdout)] == ["helper"]
    assert "helper" in ashd(server, "agents", "show", "helper").stdout
    missing = ashd(server, "agents", "show", "nope", ok=False)
    assert missing.returncode == 1 and "nope" in missing.stderr and "404" in missing.stderr

    server.script("tok-cli", TOOL_TURNS)
    out = ashd(server, "chat", "helper", "-m", "write it tok-cli").stdout
    assert "Creating the file." in out and "→ Write" in out and "← File written" in out and "Done: hello.txt" in out

    (session,) = json.loads(ashd(server, "sessions", "list", "--json").stdout)
    sid = session["id"]
    assert ashd(server, "sessions", "files", sid, "hello.txt").stdout == "hi from cli"
    raw = subprocess.run([*ASHD, "sessions", "files", sid, "notes.txt"], env=server.env(), capture_output=True,
                         timeout=60, check=True).stdout
    assert raw == b"\x00binary\xff"  # uploaded as base64, printed byte for byte
    events = ashd(server, "sessions", "events", sid).stdout
    assert "tool_start" in events and "toolName=Write" in events and "turn_complete" in events
    assert ashd(server, "sessions", "pause", sid).stdout.split() == [sid, "paused"]
    assert ashd(server, "sessions", "resume", sid).stdout.split() == [sid, "active"]
    assert ashd(server, "sessions", "stop", sid).stdout.split() == [sid, "stopped"]
    assert ashd(server, "sessions", "rm", sid).stdout.split() == [sid, "ended"]
    assert '"status": "ok"' in ashd(server, "status", "--json").stdout
    assert "pool" in ashd(server, "status").stdout

    # keys from another directory, naming the server's data directory: the server accepts the key
    key = ashd(None, "keys", "create", "--label", "cli", "--data-dir", str(server.data), cwd=short_tmp).stdout.strip()
    assert http("GET", f"{server.url}/api/agents", key)[0] == 200
    listed = json.loads(ashd(None, "keys", "list", "--json", "--data-dir", str(server.data)).stdout)
    cli_key = next(k for k in listed if k["label"] == "cli")
    ashd(None, "keys", "revoke", cli_key["id"], "--data-dir", str(server.data))
    deadline = time.monotonic() + 30  # the server caches a verified key for a few seconds
    while http("GET", f"{server.url}/api/agents", key)[0] != 401:
        assert time.monotonic() < deadline, "the revoked key is still accepted"
        time.sleep(0.2)
    assert ashd(server, "agents", "rm", "helper").stdout.strip() == "removed helper"


class Tmux:
    def __init__(self, socket: Path) -> None:
        self.base = [tool("tmux"), "-S", str(socket)]

    def __call__(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], check=True, capture_output=True, text=True, timeout=30).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-J", "-S", "-200")

    def wait_for(self, text: str, times: int = 1) -> str:
        deadline = time.monotonic() + 120
        while True:
            screen = self.screen()
            if screen.count(text) >= times:
                return screen
            assert time.monotonic() < deadline, f"{text!r} never showed:\n{screen}"
            time.sleep(0.1)


@pytest.mark.sandbox
def test_chat_in_a_real_terminal(server: Server, short_tmp: Path) -> None:
    folder = short_tmp / "helper"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You are a helpful agent.")
    ashd(server, "agents", "deploy", str(folder))
    server.script("tok-tty", TOOL_TURNS)
    tmux = Tmux(short_tmp / "tmux.sock")
    env_args = [arg for k, v in server.env().items() if k in {"ASHD_URL", "ASHD_KEY", "PATH", "HOME"}
                for arg in ("-e", f"{k}={v}")]
    command = " ".join([*ASHD, "chat", "helper"]) + "; echo chat-exited-$?; sleep 600"
    tmux("new-session", "-d", "-x", "110", "-y", "40", *env_args, command)
    try:
        tmux.wait_for("you> ")
        tmux("send-keys", "-l", "hello terminal")
        tmux("send-keys", "Enter")
        tmux.wait_for("echo: hello terminal")
        tmux.wait_for("you> ", times=2)  # the turn is over: the prompt is back
        tmux("send-keys", "-l", "now write it tok-tty")
        tmux("send-keys", "Enter")
        screen = tmux.wait_for("Done: hello.txt written.")
        tmux.wait_for("you> ", times=3)
        assert "→ Write" in screen and "← File written" in screen
        tmux("send-keys", "C-d")
        screen = tmux.wait_for("chat-exited-0")
        assert "stays; continue with" in screen
    finally:
        recording = tmux.screen()
        subprocess.run([*tmux.base, "kill-server"], capture_output=True, timeout=30)
    out = Path(os.environ.get("ASHD_TEST_ARTIFACTS", short_tmp))
    out.mkdir(parents=True, exist_ok=True)
    (out / "chat-recording.txt").write_text(recording.rstrip() + "\n")


@pytest.mark.sandbox
def test_without_an_api_key_the_turn_says_so(short_tmp: Path, fake_model_process: str) -> None:  # noqa: F811
    """The quick start's old trap: only ANTHROPIC_BASE_URL set. The model proxy's own refusal reaches
    the client as it is, not rewritten into "the model API rejected the API key (401)"."""
    data, port = short_tmp / "data", free_port()
    proc = start(data, port, ANTHROPIC_BASE_URL=fake_model_process, ANTHROPIC_API_KEY="")  # empty: unset
    try:
        plain = Server(f"http://127.0.0.1:{port}", (data / "initial-api-key").read_text().strip(), data,
                       fake_model_process, proc)
        folder = short_tmp / "helper"
        folder.mkdir()
        (folder / "AGENT.md").write_text("You are a helpful agent.")
        ashd(plain, "agents", "deploy", str(folder))
        out = ashd(plain, "chat", "helper", "-m", "hello").stdout
        assert "no API key for this session" in out and "ANTHROPIC_API_KEY" in out, out
        assert "rejected the API key" not in out
    finally:
        stop(proc)


SLOW_SETUP = "echo setup-says-hello\necho setup-complains >&2\necho setup-progress-marker\nsleep 4\necho setup-done\n"


@pytest.mark.sandbox
def test_session_logs_and_following_them(server: Server, short_tmp: Path) -> None:
    folder = short_tmp / "builder"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You build things.")
    (folder / "setup.sh").write_text("echo setup-says-hello\necho setup-complains >&2\n")
    ashd(server, "agents", "deploy", str(folder))
    ashd(server, "chat", "builder", "-m", "hello")
    (session,) = json.loads(ashd(server, "sessions", "list", "--json").stdout)
    sid = session["id"]
    out = ashd(server, "sessions", "logs", sid).stdout
    assert "stdout setup-says-hello" in out and "stderr setup-complains" in out and "system running sh setup.sh" in out
    lines = [json.loads(line) for line in ashd(server, "sessions", "logs", sid, "--json").stdout.splitlines()]
    assert lines[0]["index"] == 0 and {"index", "level", "ts", "text"} <= set(lines[0])
    assert [x["index"] for x in lines] == list(range(len(lines)))

    # --follow keeps going while the session has a sandbox, and ends by itself once it has none.
    follow = subprocess.Popen([*ASHD, "sessions", "logs", sid, "--follow"], env=server.env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(2)
        assert follow.poll() is None, follow.communicate()
        assert ashd(server, "sessions", "stop", sid).stdout.split() == [sid, "stopped"]
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert "setup-says-hello" in out
    ashd(server, "chat", "builder", "--session", sid, "-m", "again")  # resumes the stopped session
    assert json.loads(ashd(server, "sessions", "show", sid, "--json").stdout)["status"] == "active"
    missing = ashd(server, "sessions", "logs", "00000000-0000-0000-0000-000000000000", ok=False)
    assert missing.returncode == 1 and "404" in missing.stderr


@pytest.mark.sandbox
def test_chat_shows_the_setup_while_it_runs(server: Server, short_tmp: Path) -> None:
    folder = short_tmp / "slow"
    folder.mkdir()
    (folder / "AGENT.md").write_text("You take your time.")
    (folder / "setup.sh").write_text(SLOW_SETUP)
    ashd(server, "agents", "deploy", str(folder))
    tmux = Tmux(short_tmp / "tmux.sock")
    env_args = [arg for k, v in server.env().items() if k in {"ASHD_URL", "ASHD_KEY", "PATH", "HOME"}
                for arg in ("-e", f"{k}={v}")]
    command = " ".join([*ASHD, "chat", "slow"]) + "; echo chat-exited-$?; sleep 600"
    tmux("new-session", "-d", "-x", "140", "-y", "20", *env_args, command)
    try:
        # Beside the spinner, while POST /api/sessions still waits for the setup: its newest line.
        screen = tmux.wait_for("setup-progress-marker")
        assert "starting a session of slow" in screen and "you> " not in screen
        tmux.wait_for("you> ")
        tmux("send-keys", "C-d")
        tmux.wait_for("chat-exited-0")
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True, timeout=30)
