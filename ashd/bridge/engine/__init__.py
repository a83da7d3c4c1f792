"""The agent engine: a tool-using loop over the anthropic Messages API.

`Engine` (in `_loop`) is what the bridge drives; the rest are its parts: model calls with retries
(`_model`), permissions, skills, MCP servers, subagents and the built-in tools (`tools/`).
"""

from ashd.bridge.engine._config import EngineConfig
from ashd.bridge.engine._loop import Engine, EngineError

__all__ = ["Engine", "EngineConfig", "EngineError"]
