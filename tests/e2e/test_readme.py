"""The README's quick start, run as it is written: its shell blocks, in a copy of this checkout, with
the offline model. The only change is the ports (a free one for 4100 and for 4999), so the test can
run beside a server a developer has on the default port."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_serve_process import free_port

ROOT = Path(__file__).resolve().parents[2]
ONLINE = "ANTHROPIC_API_KEY=sk-ant-..."  # the block that needs a real key: the offline one replaces it

pytestmark = [
    pytest.mark.sandbox,
    # scripts/test_installed runs the suite from a copy of tests/ without the checkout whose scripts
    # the quick start runs; scripts/test (the other CI leg) runs this test.
    pytest.mark.skipif("ASHD_TEST_INSTALLED" in os.environ, reason="needs the checkout (run by scripts/test)"),
]


def quick_start_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):]
    section = section[:section.index("\n## ", 3)]
    return [block.replace("\\\n", " ") for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def copy_checkout(dest: Path) -> None:
    """The tracked tree as it is now (mtimes kept, so pyproject.toml is no newer than the venv's
    install stamp), with the test's own virtualenv as .venv: nothing is installed again."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".venv*", "data", ".git", "__pycache__", "*.egg-info", ".*_cache", "build", "dist", "agents"))
    venv = Path(sys.prefix)
    stamps = [venv / ".installed", venv / ".installed-dev"]
    newest = max((p.stat().st_mtime for p in stamps if p.exists()), default=0.0)
    # Otherwise scripts/_env.sh would install the copy into this virtualenv, in place of the checkout.
    assert newest >= (ROOT / "pyproject.toml").stat().st_mtime, "run scripts/test first: .venv is not up to date"
    (dest / ".venv").symlink_to(venv)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in reversed(procs):  # the server first: it is last started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)


def test_quick_start_word_for_word(short_tmp: Path, background: list[subprocess.Popen[bytes]]) -> None:
    repo = short_tmp / "repo"
    copy_checkout(repo)
    port, model_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVICE_", "ANTHROPIC_", "ASHD_"))}
    env.update({"SERVICE_PORT": str(port), "ASHD_URL": f"http://127.0.0.1:{port}"})

    def ported(command: str) -> str:
        return command.replace("4100", str(port)).replace("4999", str(model_port))

    blocks = quick_start_blocks()
    assert sum(ONLINE in block for block in blocks) == 1
    outputs = []
    for block in blocks:
        if ONLINE in block:
            continue
        if "./scripts/serve" in block:  # the offline block: the fake model in the background, then ashd
            for line in filter(None, (ln.split("#")[0].strip() for ln in block.splitlines())):
                log = short_tmp / f"bg-{len(background)}.log"
                proc = subprocess.Popen(["bash", "-c", ported(line.removesuffix("&").strip())], cwd=repo, env=env,
                                        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
                background.append(proc)
                url = f"http://127.0.0.1:{port}/health" if "serve" in line else f"http://127.0.0.1:{model_port}/"
                wait_http(url, proc, log)
            continue
        result = subprocess.run(["bash", "-c", "set -euo pipefail\n" + ported(block)], cwd=repo, env=env,
                                input=b"hello readme\n", capture_output=True, timeout=300)
        assert result.returncode == 0, (block, result.stdout.decode(), result.stderr.decode())
        outputs.append(result.stdout.decode())

    assert len(background) == 2, "the offline block starts the fake model and ashd"
    cli, curl = outputs
    assert "ok" in cli and "deployed helper version 1" in cli and "echo: hello readme" in cli
    assert curl.startswith('{"status":"ok"') and "echo: Write hello.txt" in curl
    events = re.findall(r"^event: (\w+)$", curl, re.M)
    assert events[-1] == "done" and "error" not in events, events
