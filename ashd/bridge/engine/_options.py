"""Per-query options (the `query` frame's `maxTurns`, `effort`, `thinking`, `outputFormat`,
`maxBudgetUsd`; docs/protocol.md) and the live session config a query may carry (`config`).

The server has checked them; the bridge reads them leniently (a value of the wrong shape is left
out), since a bad value must not cost the user a failed turn the server already accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ashd.bridge.engine._config import EngineConfig, _str_list

EFFORT_BETA = "effort-2025-11-24"  # the Messages API's `output_config.effort` is behind this beta
STRUCTURED_OUTPUT_TOOL = "StructuredOutput"  # the Claude Agent SDK's name for the same tool
# The live config a query frame (or PATCH .../config) may change.
LIVE_CONFIG_KEYS = ("model", "allowedTools", "disallowedTools", "betas", "subagents", "initialAgent")


@dataclass(frozen=True)
class QueryOptions:
    max_turns: int | None = None
    effort: str | None = None
    thinking: dict[str, Any] | None = None  # the Messages API's shape: {type, budget_tokens?}
    output_schema: dict[str, Any] | None = None  # outputFormat.schema
    max_budget_usd: float | None = None  # enforced by the model proxy; the SDK's CLI is told too

    @classmethod
    def from_frame(cls, frame: dict[str, Any]) -> QueryOptions:
        turns = frame.get("maxTurns")
        effort = frame.get("effort")
        thinking = frame.get("thinking")
        fmt = frame.get("outputFormat")
        budget = frame.get("maxBudgetUsd")
        return cls(
            max_turns=turns if isinstance(turns, int) and not isinstance(turns, bool) and turns > 0 else None,
            effort=effort if isinstance(effort, str) and effort else None,
            thinking=thinking if isinstance(thinking, dict) and isinstance(thinking.get("type"), str) else None,
            output_schema=fmt.get("schema") if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict) else None,
            max_budget_usd=float(budget) if isinstance(budget, int | float) and not isinstance(budget, bool)
            and budget > 0 else None,
        )

    @property
    def thinking_budget(self) -> int | None:
        if self.thinking is None or self.thinking.get("type") != "enabled":
            return None
        budget = self.thinking.get("budget_tokens")
        return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def apply_live_config(config: EngineConfig, changes: dict[str, Any]) -> bool:
    """Apply the session's changed config (PATCH .../config) to the engine's; True if anything changed.
    A key present with null clears the setting (back to the agent's default)."""
    before = (config.model, config.allowed_tools, config.disallowed_tools, config.betas, config.subagents,
              config.initial_agent)
    if "model" in changes:
        config.model = changes["model"] if isinstance(changes["model"], str) and changes["model"] else None
    if "allowedTools" in changes:
        config.allowed_tools = _str_list(changes["allowedTools"])
    if "disallowedTools" in changes:
        config.disallowed_tools = _str_list(changes["disallowedTools"])
    if "betas" in changes:
        config.betas = _str_list(changes["betas"])
    if "subagents" in changes:
        subagents = changes["subagents"] if isinstance(changes["subagents"], dict) else {}
        config.subagents = {str(k): v for k, v in subagents.items() if isinstance(v, dict)}
    if "initialAgent" in changes:
        value = changes["initialAgent"]
        config.initial_agent = value if isinstance(value, str) and value else None
    after = (config.model, config.allowed_tools, config.disallowed_tools, config.betas, config.subagents,
             config.initial_agent)
    return before != after
