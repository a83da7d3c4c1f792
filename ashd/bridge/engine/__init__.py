"""The agent engines: the built-in tool-using loop over the anthropic Messages API, and the Claude
Agent SDK's CLI (`claude-agent-sdk`).

`Engine` (in `_loop`) is the built-in engine; the rest are its parts: model calls with retries
(`_model`), prompt caching (`_cache`), compaction (`_compact`), permissions, skills, MCP servers,
subagents and the built-in tools (`tools/`). `SdkEngine` (in `_sdk`) drives the CLI instead.
`make_engine` picks one from the configuration (`docs/engines.md`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ashd.bridge.engine._config import EngineConfig
from ashd.bridge.engine._loop import Engine, EngineError
from ashd.bridge.engine._options import QueryOptions
from ashd.bridge.engine._sdk import SdkEngine
from ashd.engines import BUILTIN, ENGINES

AnyEngine = Engine | SdkEngine


def make_engine(config: EngineConfig, log_fn: Callable[[str, str], Awaitable[None]]) -> AnyEngine:
    if config.engine == BUILTIN:
        return Engine(config, log_fn)
    if config.engine == SdkEngine.NAME:
        return SdkEngine(config, log_fn)
    raise EngineError(f"unknown engine {config.engine!r}: this bridge has {', '.join(ENGINES)}")


__all__ = ["AnyEngine", "Engine", "EngineConfig", "EngineError", "QueryOptions", "SdkEngine", "make_engine"]
