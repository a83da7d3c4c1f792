"""The engine's configuration: the `init` command's `config` plus `.agent/settings.json`."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ashd.engines import BUILTIN
from ashd.model_names import DEFAULT_CONTEXT_WINDOW, DEFAULT_MODEL

log = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 50
DEFAULT_MAX_TOKENS = 8192


def _str_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


@dataclass
class EngineConfig:
    workspace: Path
    model_socket: str | None = None
    system_prompt: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    permission_mode: str = "bypassPermissions"
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    betas: list[str] = field(default_factory=list)
    subagents: dict[str, dict[str, Any]] = field(default_factory=dict)
    initial_agent: str | None = None
    max_turns: int = DEFAULT_MAX_TURNS
    max_tokens: int = DEFAULT_MAX_TOKENS
    history: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    # The window assumed for models ashd.model_names does not know (SERVICE_MODEL_CONTEXT_WINDOW).
    context_window: int = DEFAULT_CONTEXT_WINDOW
    # `.agent/settings.json` `engine`, else the init's (the server's SERVICE_ENGINE), else builtin.
    engine: str = BUILTIN

    @classmethod
    def from_init(cls, config: dict[str, Any], workspace: Path, model_socket: str | None) -> EngineConfig:
        settings = load_settings(workspace)
        prompt = config.get("systemPrompt")
        if not isinstance(prompt, str) or not prompt:
            agent_md = workspace / "AGENT.md"
            prompt = agent_md.read_text(errors="replace") if agent_md.is_file() else None
        subagents = config.get("subagents") if isinstance(config.get("subagents"), dict) else {}
        return cls(
            workspace=workspace,
            model_socket=model_socket,
            system_prompt=prompt,
            env={str(k): str(v) for k, v in (config.get("env") or {}).items()},
            model=config.get("model") or None,
            permission_mode=config.get("permissionMode") or "bypassPermissions",
            allowed_tools=_str_list(config.get("allowedTools")),
            disallowed_tools=_str_list(config.get("disallowedTools")),
            betas=_str_list(config.get("betas")),
            subagents={str(k): v for k, v in (subagents or {}).items() if isinstance(v, dict)},
            initial_agent=config.get("initialAgent") or None,
            max_turns=int(config.get("maxTurns") or DEFAULT_MAX_TURNS),
            max_tokens=int(config.get("maxTokens") or DEFAULT_MAX_TOKENS),
            history=list(config.get("history") or []),
            settings=settings,
            session_id=config.get("sessionId") or None,
            context_window=int(config.get("contextWindow") or DEFAULT_CONTEXT_WINDOW),
            engine=str(settings.get("engine") or config.get("engine") or BUILTIN),
        )

    def default_model(self) -> str:
        """init.model > settings.json model > DEFAULT_MODEL (query.model is applied per query)."""
        settings_model = self.settings.get("model")
        return self.model or (settings_model if isinstance(settings_model, str) else None) or DEFAULT_MODEL

    def tool_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("HOME", "/home/agent")
        return env

    def allow_rules(self) -> list[str]:
        perms = self.settings.get("permissions")
        return _str_list(perms.get("allow")) if isinstance(perms, dict) else []

    def deny_rules(self) -> list[str]:
        perms = self.settings.get("permissions")
        return _str_list(perms.get("deny")) if isinstance(perms, dict) else []


def load_settings(workspace: Path) -> dict[str, Any]:
    path = workspace / ".agent" / "settings.json"
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except ValueError as exc:
        log.warning("ignoring %s: not valid JSON (%s)", path, exc)
        return {}
    return value if isinstance(value, dict) else {}
