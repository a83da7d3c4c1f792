"""The set of built-in tools (Task is added by the engine, which owns subagents)."""

from __future__ import annotations

from ashd.bridge.engine.tools._base import Tool
from ashd.bridge.engine.tools._bash import BashTool
from ashd.bridge.engine.tools._files import EditTool, ReadTool, WriteTool
from ashd.bridge.engine.tools._search import GlobTool, GrepTool


def builtin_tools() -> list[Tool]:
    return [BashTool(), ReadTool(), WriteTool(), EditTool(), GlobTool(), GrepTool()]
