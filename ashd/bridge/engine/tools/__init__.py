"""Built-in tools with the Agent SDK's names and input schemas."""

from ashd.bridge.engine.tools._base import Tool, ToolContext, ToolResult
from ashd.bridge.engine.tools._registry import builtin_tools

__all__ = ["Tool", "ToolContext", "ToolResult", "builtin_tools"]
