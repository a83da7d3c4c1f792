"""The tool interface shared by built-in tools, MCP tools and Task."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

OUTPUT_CAP = 30_000


@dataclass
class ToolResult:
    # A string or a list of Anthropic content blocks (text/image), as a tool_result accepts.
    content: str | list[dict[str, Any]]
    is_error: bool = False


@dataclass
class ToolContext:
    workspace: Path
    env: Mapping[str, str] = field(default_factory=dict)
    tool_use_id: str = ""
    # Process groups this call started: stopped when the call hit the sandbox's process limit.
    process_groups: list[int] = field(default_factory=list)


class Tool(Protocol):
    name: str
    description: str
    input_schema: dict[str, Any]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {len(text) - limit} more characters]"


def resolve(ctx: ToolContext, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else ctx.workspace / p


def require_str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ValueError(f"'{key}' is required and must be a string")
    return value
