"""The agent engines a deployment can run, and whether each is installed.

A leaf module (no aiohttp, no anthropic): the server checks an agent's `engine` at deploy and
SERVICE_ENGINE at start with it, and the bridge picks its engine with the same names. Sandboxes run
the server's own Python installation, so what is installed here is what a sandbox has.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

BUILTIN = "builtin"
SDK = "claude-agent-sdk"
ENGINES = (BUILTIN, SDK)
SETTINGS_FILE = ".agent/settings.json"


def bundled_cli() -> Path | None:
    """The Claude Code CLI inside the installed claude-agent-sdk package, found without importing it."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "_bundled" / "claude"
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def engine_problem(name: Any) -> str | None:
    """Why `name` cannot run here, for a person; None when it can."""
    if name not in ENGINES:
        return f"unknown engine {str(name)[:100]!r}: the engines are {', '.join(ENGINES)}"
    if name == SDK and bundled_cli() is None:
        return ("the claude-agent-sdk engine is not installed on this server: install ashd with its `sdk` "
                "extra (pip install 'ashd[sdk]'), or use the builtin engine")
    return None


def settings_engine(raw: bytes | str | None) -> Any:
    """The `engine` an agent's .agent/settings.json names (None when it names none or is unreadable;
    the engine ignores such a file too)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value.get("engine") if isinstance(value, dict) else None
