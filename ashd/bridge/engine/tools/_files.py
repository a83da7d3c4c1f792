"""Read, Write and Edit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ashd.bridge.engine.tools._base import ToolContext, ToolResult, cap, require_str, resolve

DEFAULT_READ_LINES = 2000
MAX_LINE_CHARS = 2000


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise ValueError(f"{path} looks like a binary file; use Bash to inspect it")
    return data.decode(errors="replace")


class ReadTool:
    name = "Read"
    description = (
        "Reads a file from the workspace and returns it with line numbers (cat -n style). "
        "Use offset (1-based line) and limit for large files."
    )
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The path of the file to read"},
            "offset": {"type": "number", "description": "The line number to start reading from"},
            "limit": {"type": "number", "description": "The number of lines to read"},
        },
        "required": ["file_path"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = resolve(ctx, require_str(args, "file_path"))
        if not path.is_file():
            return ToolResult(f"File does not exist: {path}", is_error=True)
        text = await asyncio.to_thread(_read_text, path)
        lines = text.splitlines()
        start = max(int(args.get("offset") or 1), 1)
        limit = int(args.get("limit") or DEFAULT_READ_LINES)
        chosen = lines[start - 1 : start - 1 + limit]
        if not chosen:
            return ToolResult(f"(file has {len(lines)} lines; nothing at offset {start})")
        out = "\n".join(f"{n:>6}\t{line[:MAX_LINE_CHARS]}" for n, line in enumerate(chosen, start=start))
        return ToolResult(cap(out))


class WriteTool:
    name = "Write"
    description = "Writes a file in the workspace, creating parent directories; overwrites an existing file."
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The path of the file to write"},
            "content": {"type": "string", "description": "The content to write"},
        },
        "required": ["file_path", "content"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = resolve(ctx, require_str(args, "file_path"))
        content = require_str(args, "content")

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)

        await asyncio.to_thread(write)
        return ToolResult(f"File written: {path} ({len(content)} characters)")


class EditTool:
    name = "Edit"
    description = "Replaces old_string with new_string in a file. old_string must be unique unless replace_all is true."
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The path of the file to modify"},
            "old_string": {"type": "string", "description": "The text to replace"},
            "new_string": {"type": "string", "description": "The replacement text"},
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["file_path", "old_string", "new_string"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = resolve(ctx, require_str(args, "file_path"))
        old = require_str(args, "old_string")
        new = require_str(args, "new_string")
        if not path.is_file():
            return ToolResult(f"File does not exist: {path}", is_error=True)
        if old == new:
            return ToolResult("old_string and new_string are the same; nothing to change", is_error=True)
        text = await asyncio.to_thread(_read_text, path)
        count = text.count(old)
        if count == 0:
            return ToolResult(f"old_string not found in {path}", is_error=True)
        if count > 1 and not args.get("replace_all"):
            return ToolResult(
                f"old_string occurs {count} times in {path}; add context to make it unique or set replace_all",
                is_error=True,
            )
        updated = text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
        await asyncio.to_thread(path.write_text, updated)
        return ToolResult(f"Edited {path}: {count if args.get('replace_all') else 1} replacement(s)")
