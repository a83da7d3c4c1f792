"""The `exec` command: run a program in the workspace and return its capped output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

OUTPUT_CAP_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_S = 60.0


def _capped(data: bytes) -> str:
    text = data[:OUTPUT_CAP_BYTES].decode(errors="replace")
    if len(data) > OUTPUT_CAP_BYTES:
        text += f"\n... [truncated: {len(data) - OUTPUT_CAP_BYTES} more bytes]"
    return text


# Programs the bridge starts are the OOM killer's first choice in the sandbox's memory cgroup:
# without it the bridge, whose RSS counts the pages it shares with the zygote, can be picked over
# the tool that ran the sandbox out of memory, and the whole session's sandbox dies with it.
# Raising one's score needs no privilege; children inherit it.
TOOL_OOM_SCORE_ADJ = 1000


def prefer_for_oom_kill(pid: int) -> None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as f:
        f.write(str(TOOL_OOM_SCORE_ADJ))


async def spawn(argv: list[str], workspace: Path, env: dict[str, str], *,
                merge_stderr: bool = False) -> asyncio.subprocess.Process:
    """Start a program in the workspace in a process group of its own (so it can be killed whole),
    marked as the first to go when the sandbox runs out of memory."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(workspace),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    prefer_for_oom_kill(proc.pid)
    return proc


async def communicate(proc: asyncio.subprocess.Process, timeout: float) -> tuple[bytes, bytes, bool]:
    """Collect a process group's output; kill the whole group on timeout or cancellation.
    Returns (stdout, stderr, timed_out)."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return out, err or b"", False
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        return out, err or b"", True
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


async def run_exec(argv: Any, timeout: Any, workspace: Path, env: dict[str, str]) -> dict[str, Any]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return {"exitCode": -1, "stdout": "", "stderr": "exec: 'argv' must be a non-empty list of strings"}
    limit = float(timeout) if isinstance(timeout, int | float) and timeout > 0 else DEFAULT_TIMEOUT_S
    try:
        proc = await spawn(argv, workspace, env)
    except OSError as exc:
        return {"exitCode": 127, "stdout": "", "stderr": f"exec: cannot start {argv[0]}: {exc}"}
    out, err, timed_out = await communicate(proc, limit)
    stderr = _capped(err)
    if timed_out:
        stderr += f"\nexec: timed out after {limit:g}s"
    result: dict[str, Any] = {"exitCode": proc.returncode, "stdout": _capped(out), "stderr": stderr}
    if timed_out:
        result["timedOut"] = True
    return result
