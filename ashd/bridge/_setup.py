"""Workspace setup on init: `npm install` if package.json exists, then `sh setup.sh` once."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ashd.bridge._exec import communicate, spawn

LogFn = Callable[[str, str], Awaitable[None]]
DEFAULT_TIMEOUT_S = 300.0
_TAIL_LINES = 20
_DONE_MARKER = "setup.done"


class SetupFailed(Exception):
    pass


def logs_dir() -> Path:
    # Kept out of /workspace so that setup logs never show in the session's file listing.
    return Path(os.environ.get("HOME") or "/home/agent") / ".ashd-logs"


async def _run_step(
    name: str, argv: list[str], workspace: Path, env: dict[str, str], timeout: float, log: LogFn
) -> None:
    out_dir = logs_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{name}.log"
    await log("info", f"setup: running {' '.join(argv)}")
    proc = await spawn(argv, workspace, env, merge_stderr=True)
    output, _, timed_out = await communicate(proc, timeout)
    text = output.decode(errors="replace")
    log_path.write_text(text)
    for line in text.splitlines()[-200:]:
        await log("info", f"{name}: {line}")
    tail = "\n".join(text.splitlines()[-_TAIL_LINES:])
    if timed_out:
        raise SetupFailed(f"{name} timed out after {timeout:.0f}s: {tail}")
    if proc.returncode != 0:
        raise SetupFailed(f"{name} failed (exit {proc.returncode}): {tail}")


async def run_setup(workspace: Path, env: dict[str, str], timeout: float | None, log: LogFn) -> None:
    """Raises SetupFailed with a message naming the step, its exit status and its last lines."""
    marker = logs_dir() / _DONE_MARKER
    if marker.exists():
        await log("info", "setup: already done for this workspace")
        return
    limit = timeout or DEFAULT_TIMEOUT_S
    started = time.monotonic()
    if (workspace / "package.json").is_file():
        await _run_step("npm install", ["npm", "install"], workspace, env, limit, log)
    if (workspace / "setup.sh").is_file():
        remaining = max(1.0, limit - (time.monotonic() - started))
        await _run_step("setup.sh", ["sh", "setup.sh"], workspace, env, remaining, log)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("ok\n")
