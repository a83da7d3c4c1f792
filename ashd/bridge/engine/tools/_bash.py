"""Bash: runs a shell command in the workspace with the session env."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from typing import Any

from ashd.bridge._exec import spawn
from ashd.bridge.engine.tools._base import ToolContext, ToolResult, cap, require_str

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000


async def run_process(argv: list[str], ctx: ToolContext, timeout_s: float) -> tuple[int | None, bytes, bytes]:
    """Run argv in its own process group; on timeout or cancellation kill the whole group."""
    proc = await spawn(argv, ctx.workspace, dict(ctx.env))
    ctx.process_groups.append(proc.pid)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill_group(proc.pid)
        out, err = await proc.communicate()
        return None, out, err
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return proc.returncode, out, err


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class BashTool:
    name = "Bash"
    description = (
        "Executes a bash command in the workspace (cwd /workspace) and returns its output. "
        "Optional timeout in milliseconds (default 120000, max 600000)."
    )
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
            "description": {"type": "string", "description": "What this command does, in 5-10 words"},
        },
        "required": ["command"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command = require_str(args, "command")
        timeout_ms = args.get("timeout") or DEFAULT_TIMEOUT_MS
        timeout_ms = max(1, min(int(timeout_ms), MAX_TIMEOUT_MS))
        shell = shutil.which("bash") or "/bin/sh"
        code, out, err = await run_process([shell, "-c", command], ctx, timeout_ms / 1000)
        text = out.decode(errors="replace")
        if err:
            text += ("\n" if text and not text.endswith("\n") else "") + err.decode(errors="replace")
        if code is None:
            text += f"\nCommand timed out after {timeout_ms} ms"
            return ToolResult(cap(text.strip()), is_error=True)
        if code != 0:
            text += f"\nExit code {code}"
        return ToolResult(cap(text.strip()) or "(no output)", is_error=code != 0)
