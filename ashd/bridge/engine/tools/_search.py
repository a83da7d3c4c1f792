"""Glob and Grep, in pure Python (no ripgrep in the sandbox)."""

from __future__ import annotations

import asyncio
import fnmatch
import re
from pathlib import Path
from typing import Any

from ashd.bridge.engine.tools._base import ToolContext, ToolResult, cap, require_str, resolve

MAX_RESULTS = 1000
_SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv"})


def _walk(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    found: list[Path] = []
    for path in root.rglob("*"):
        if any(part in _SKIP_DIRS for part in path.relative_to(root).parts[:-1]):
            continue
        if path.is_file():
            found.append(path)
    return found


class GlobTool:
    name = "Glob"
    description = "Finds files by glob pattern (e.g. **/*.py); newest first."
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The glob pattern to match files against"},
            "path": {"type": "string", "description": "The directory to search in (default: workspace)"},
        },
        "required": ["pattern"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        pattern = require_str(args, "pattern")
        root = resolve(ctx, args.get("path") or str(ctx.workspace))

        def search() -> list[Path]:
            hits = [p for p in root.glob(pattern) if p.is_file()]
            hits.sort(key=lambda p: p.stat().st_mtime, reverse=True)
            return hits[:MAX_RESULTS]

        hits = await asyncio.to_thread(search)
        if not hits:
            return ToolResult("No files found")
        return ToolResult(cap("\n".join(str(p) for p in hits)))


class GrepTool:
    name = "Grep"
    description = (
        "Searches file contents with a regular expression (Python re syntax). output_mode: "
        "files_with_matches (default), content (matching lines with line numbers) or count."
    )
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The regular expression to search for"},
            "path": {"type": "string", "description": "File or directory to search (default: workspace)"},
            "glob": {"type": "string", "description": "Only files whose name matches this glob"},
            "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
            "-i": {"type": "boolean", "description": "Case insensitive search"},
            "head_limit": {"type": "number", "description": "Limit output to the first N entries"},
        },
        "required": ["pattern"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            regex = re.compile(require_str(args, "pattern"), re.IGNORECASE if args.get("-i") else 0)
        except re.error as exc:
            return ToolResult(f"Invalid regular expression: {exc}", is_error=True)
        root = resolve(ctx, args.get("path") or str(ctx.workspace))
        name_glob = args.get("glob")
        mode = args.get("output_mode") or "files_with_matches"
        limit = int(args.get("head_limit") or MAX_RESULTS)

        def search() -> list[str]:
            out: list[str] = []
            for path in _walk(root):
                rel = str(path.relative_to(root)) if path != root else path.name
                if name_glob and not (fnmatch.fnmatch(path.name, name_glob) or fnmatch.fnmatch(rel, name_glob)):
                    continue
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                if b"\0" in data[:8192]:
                    continue
                lines = data.decode(errors="replace").splitlines()
                matches = [(n, line) for n, line in enumerate(lines, 1) if regex.search(line)]
                if not matches:
                    continue
                if mode == "content":
                    out.extend(f"{path}:{n}:{line}" for n, line in matches)
                elif mode == "count":
                    out.append(f"{path}:{len(matches)}")
                else:
                    out.append(str(path))
                if len(out) >= limit:
                    break
            return out[:limit]

        found = await asyncio.to_thread(search)
        if not found:
            return ToolResult("No matches found")
        return ToolResult(cap("\n".join(found)))
