"""Task: hands a prompt to a subagent and returns its final text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ashd.bridge.engine.tools._base import ToolContext, ToolResult, require_str

RunSubagent = Callable[[str, str, str], Awaitable[ToolResult]]


class TaskTool:
    name = "Task"
    # A constant of the class, as the built-in tools' are: the request's tool definitions are
    # encoded once per set of tools (engine/_tool_defs.py).
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "description": {
                "type": "string",
                "description": "A short (3-5 word) description of the task",
            },
            "prompt": {"type": "string", "description": "The task for the subagent to perform"},
            "subagent_type": {"type": "string", "description": "The type of subagent to use"},
        },
        "required": ["description", "prompt", "subagent_type"],
    }

    def __init__(self, run: RunSubagent, subagents: dict[str, dict[str, Any]]) -> None:
        self._run = run
        listing = "\n".join(
            f"- {name}: {spec.get('description') or ''}".rstrip() for name, spec in sorted(subagents.items())
        )
        self.description = (
            "Launches a subagent to handle a task on its own and returns its final answer. "
            "Available subagent types:\n- general-purpose: a general agent with the same tools"
            + (f"\n{listing}" if listing else "")
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        prompt = require_str(args, "prompt")
        agent = args.get("subagent_type") or "general-purpose"
        return await self._run(str(agent), prompt, ctx.tool_use_id)
