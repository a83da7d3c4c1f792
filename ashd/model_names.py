"""Model names the engine and the server agree on: the engine's default and the subagent aliases.

A leaf module (no imports of the engine or the anthropic SDK), so the server can compute the model
precedence of a turn exactly as the engine inside the sandbox does.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MODEL = "claude-sonnet-4-5"
MODEL_ALIASES = {"sonnet": "claude-sonnet-4-5", "opus": "claude-opus-4-5", "haiku": "claude-haiku-4-5"}


def subagent_model(value: Any) -> str | None:
    """The model a subagent definition names (`inherit` or nothing: the main thread's model)."""
    if not isinstance(value, str) or not value or value == "inherit":
        return None
    return MODEL_ALIASES.get(value, value)
