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

# Context windows in tokens, by model-name prefix (the API's dated names start with these).
DEFAULT_CONTEXT_WINDOW = 200_000
CONTEXT_WINDOWS = {
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-3": 200_000,
}
# Sonnet 4 and 4.5 take a million tokens with this beta header.
LONG_CONTEXT_BETA = "context-1m-2025-08-07"
LONG_CONTEXT_WINDOW = 1_000_000
_LONG_CONTEXT_MODELS = ("claude-sonnet-4",)


def context_window(model: str, betas: list[str], unknown: int = DEFAULT_CONTEXT_WINDOW) -> int:
    """The model's context window in tokens; `unknown` for a model this table does not know."""
    name = MODEL_ALIASES.get(model, model)
    if LONG_CONTEXT_BETA in betas and name.startswith(_LONG_CONTEXT_MODELS):
        return LONG_CONTEXT_WINDOW
    for prefix, window in CONTEXT_WINDOWS.items():
        if name.startswith(prefix):
            return window
    return unknown

# With extended thinking the engine asks for `budget_tokens` plus this much room for the reply
# (`max_tokens` counts both); the server checks the sum against its max_tokens ceiling up front.
THINKING_REPLY_TOKENS = 8192
MIN_THINKING_BUDGET = 1024  # the Messages API's minimum `budget_tokens`


def thinking_max_tokens(budget_tokens: int, default_max_tokens: int) -> int:
    """The `max_tokens` of a call that may think for `budget_tokens` (the API wants it larger)."""
    return max(default_max_tokens, budget_tokens + THINKING_REPLY_TOKENS)
