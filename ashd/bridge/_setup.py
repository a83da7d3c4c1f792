"""Workspace setup on init: `npm install` if package.json exists, then `sh setup.sh` once.

Every line a step prints, stdout and stderr apart, is sent as it comes as a `log` frame with
`source: "setup"` and `stream: stdout|stderr|system` (the server stores them as the session's
setup output: lifecycle events and `GET /api/sessions/{id}/logs`). Lines are capped in length
(`MAX_LINE_CHARS`) and in number per setup (`setupLogLines` of init); past the cap the rest is only
counted, and one `system` line says how much was cut. The whole output stays in
`$HOME/.ashd-logs/<step>.log` inside the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ashd.bridge._exec import spawn

# (stream, step, text): stream is stdout, stderr or system.
LineFn = Callable[[str, str, str], Awaitable[None]]
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_LINES = 1000
MAX_LINE_CHARS = 4000
_TAIL_LINES = 20
_READ_CHUNK = 64 * 1024
_DONE_MARKER = "setup.done"


class SetupFailed(Exception):
    pass


def logs_dir() -> Path:
    # Kept out of /workspace so that setup logs never show in the session's file listing.
    return Path(os.environ.get("HOME") or "/home/agent") / ".ashd-logs"


def cut_line(text: str) -> str:
    if len(text) <= MAX_LINE_CHARS:
        return text
    return text[:MAX_LINE_CHARS] + f" … [line cut: {len(text) - MAX_LINE_CHARS} more characters]"


@dataclass
class _Output:
    """What one setup has sent: lines under the cap go out, the rest is counted; the tail of every
    line (sent or not) makes the failure message."""

    send: LineFn
    max_lines: int
    sent: int = 0
    cut: int = 0
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    async def line(self, stream: str, step: str, text: str) -> None:
        text = cut_line(text)
        if stream != "system":
            self.tail.append(text)
        if self.sent >= self.max_lines and stream != "system":
            self.cut += 1
            return
        self.sent += 1
        await self.send(stream, step, text)
        # The other pipe's pump gets its turn after each line (a frame is often sent without waiting
        # for the loop): lines printed to stdout and stderr in turn are sent in turn, not each
        # pipe's batch after the other's.
        await asyncio.sleep(0)


async def _pump(pipe: asyncio.StreamReader, stream: str, step: str, out: _Output, logf: IO[bytes]) -> None:
    """Lines of one pipe as they come; a line longer than the cap is sent cut, its rest dropped."""
    buf = b""
    dropping = False
    while chunk := await pipe.read(_READ_CHUNK):
        logf.write(chunk)
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1:]
            if dropping:
                dropping = False
                continue
            await out.line(stream, step, line.decode(errors="replace").rstrip("\r"))
        if len(buf) > MAX_LINE_CHARS * 4:  # bytes: a UTF-8 character is at most 4
            await out.line(stream, step, buf.decode(errors="replace"))
            buf, dropping = b"", True
    if buf and not dropping:
        await out.line(stream, step, buf.decode(errors="replace").rstrip("\r"))


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _run_step(name: str, argv: list[str], workspace: Path, env: dict[str, str], timeout: float,
                    out: _Output) -> None:
    out_dir = logs_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    await out.line("system", name, f"running {' '.join(argv)}")
    started = time.monotonic()
    proc = await spawn(argv, workspace, env)
    assert proc.stdout is not None
    assert proc.stderr is not None
    timed_out = False
    with open(out_dir / f"{name}.log", "wb") as logf:
        pumps = asyncio.gather(_pump(proc.stdout, "stdout", name, out, logf),
                               _pump(proc.stderr, "stderr", name, out, logf), proc.wait())
        try:
            await asyncio.wait_for(asyncio.shield(pumps), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pumps, 10)  # what was printed before the kill still goes out
        except asyncio.CancelledError:
            _kill_group(proc)
            raise
    tail = "\n".join(out.tail)
    if timed_out:
        await out.line("system", name, f"{name} timed out after {timeout:.0f}s and was killed")
        raise SetupFailed(f"{name} timed out after {timeout:.0f}s: {tail}")
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        await out.line("system", name, f"{name} failed (exit {proc.returncode}) after {elapsed:.1f}s")
        raise SetupFailed(f"{name} failed (exit {proc.returncode}): {tail}")
    await out.line("system", name, f"{name} finished in {elapsed:.1f}s")


async def run_setup(workspace: Path, env: Callable[[], dict[str, str]], timeout: float | None, send: LineFn,
                    max_lines: int | None = None) -> bool:
    """Run the workspace's setup steps once per sandbox home. Raises SetupFailed with a message
    naming the step, its exit status and its last lines. `env` builds the steps' environment, only
    when there is a step (a copy of the bridge's: a tenth of a create's `init` CPU when built anyway).

    True when there was no step to run and the home is not marked yet: the caller marks it
    (`mark_setup_done`) once its answer is sent. Marking it is a directory and a file written in
    the sandbox's home, 0.1-0.15 ms of a create's `init`; nothing reads the mark before the next
    `init` on this home, which comes after the answer."""
    marker = logs_dir() / _DONE_MARKER
    if marker.exists():
        return False  # a resumed sandbox home: setup ran in it already
    package = (workspace / "package.json").is_file()
    if not package and not (workspace / "setup.sh").is_file():
        return True
    out = _Output(send, max_lines if max_lines and max_lines > 0 else DEFAULT_MAX_LINES)
    limit = timeout or DEFAULT_TIMEOUT_S
    started = time.monotonic()
    step_env = env()
    try:
        if package:
            await _run_step("npm install", ["npm", "install"], workspace, step_env, limit, out)
        if (workspace / "setup.sh").is_file():  # looked for again: an install may have written it
            remaining = max(1.0, limit - (time.monotonic() - started))
            await _run_step("setup.sh", ["sh", "setup.sh"], workspace, step_env, remaining, out)
    finally:
        if out.cut:
            await out.line("system", "setup", f"setup output cut: {out.cut} more lines not shown (at most "
                                              f"{out.max_lines} lines per setup); the whole output is in "
                                              f"~/.ashd-logs/ in the sandbox")
    mark_setup_done()
    return False


def mark_setup_done() -> None:
    """This sandbox home has had its setup: a later `init` on it (a resumed home) runs none."""
    marker = logs_dir() / _DONE_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("ok\n")
