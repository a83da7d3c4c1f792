"""How the claude-agent-sdk engine maps session options onto the Claude Code CLI's flags."""

from __future__ import annotations

import json
from pathlib import Path

from ashd.bridge.engine._config import EngineConfig
from ashd.bridge.engine._sdk import SdkEngine, cli_permission_mode


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


async def _log(level: str, message: str) -> None:
    return None


def test_session_options_become_cli_flags(tmp_path: Path) -> None:
    (tmp_path / ".agent").mkdir()
    (tmp_path / ".agent" / "settings.json").write_text(json.dumps({
        "engine": "claude-agent-sdk", "model": "claude-from-settings",
        "permissions": {"allow": ["Bash(git *)"], "deny": ["Bash(rm *)"]}}))
    (tmp_path / ".mcp.json").write_text("{}")
    config = EngineConfig.from_init({
        "systemPrompt": "You test.", "permissionMode": "permissionsByAgent", "allowedTools": ["Read", "Bash"],
        "disallowedTools": ["Write"], "betas": ["b1"], "maxTurns": 7, "initialAgent": "writer",
        "subagents": {"writer": {"description": "d", "prompt": "p", "tools": ["Write"], "model": "haiku"}},
        "sessionId": "5c0f0000-0000-4000-8000-000000000001"}, tmp_path, "/run/ashd/model.sock")
    assert config.engine == "claude-agent-sdk"
    engine = SdkEngine(config, _log)
    model = engine._default_model()
    assert model == "claude-haiku-4-5"  # the initialAgent's model comes before settings.json's
    argv = engine._argv(Path("/cli"), model, resume=False)
    assert flag(argv, "--model") == "claude-haiku-4-5"
    assert flag(argv, "--system-prompt") == "You test."
    assert flag(argv, "--permission-mode") == "default"
    assert flag(argv, "--allowedTools") == "Read,Bash" and flag(argv, "--disallowedTools") == "Write"
    assert flag(argv, "--betas") == "b1" and flag(argv, "--max-turns") == "7"
    assert json.loads(flag(argv, "--settings") or "") == {
        "permissions": {"allow": ["Bash(git *)"], "deny": ["Bash(rm *)"]}}
    assert flag(argv, "--mcp-config") == str(tmp_path / ".mcp.json") and "--strict-mcp-config" in argv
    assert json.loads(flag(argv, "--agents") or "")["writer"]["prompt"] == "p"
    assert flag(argv, "--agent") == "writer"
    assert flag(argv, "--session-id") == "5c0f0000-0000-4000-8000-000000000001"
    assert flag(engine._argv(Path("/cli"), model, resume=True), "--resume") == "5c0f0000-0000-4000-8000-000000000001"
    assert engine._default_model("claude-from-query") == "claude-from-query"


def test_permission_modes() -> None:
    assert cli_permission_mode("permissionsByAgent") == "default"
    assert cli_permission_mode("") == "bypassPermissions"
    assert cli_permission_mode("plan") == "plan"


def test_message_options_and_live_config_become_cli_flags(tmp_path: Path) -> None:
    from ashd.bridge.engine._options import QueryOptions

    engine = SdkEngine(EngineConfig.from_init({"maxTurns": 9, "model": "m-1"}, tmp_path, "/s"), _log)
    assert engine._query_flags(QueryOptions()) == ["--max-turns", "9"]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    options = QueryOptions.from_frame({"maxTurns": 3, "effort": "low", "maxBudgetUsd": 0.5,
                                       "thinking": {"type": "enabled", "budget_tokens": 4096},
                                       "outputFormat": {"type": "json_schema", "schema": schema}})
    flags = engine._query_flags(options)
    assert flag(flags, "--max-turns") == "3" and flag(flags, "--effort") == "low"
    assert flag(flags, "--max-thinking-tokens") == "4096" and flag(flags, "--max-budget-usd") == "0.5"
    assert json.loads(flag(flags, "--json-schema") or "") == schema
    assert flag(engine._query_flags(QueryOptions(thinking={"type": "adaptive"})), "--thinking") == "adaptive"
    assert flag(engine._query_flags(QueryOptions(thinking={"type": "disabled"})), "--thinking") == "disabled"
    # PATCH .../config: the CLI is restarted with the new flags at the next query
    engine.reconfigure({"model": "m-2", "allowedTools": ["Read"], "betas": ["b2"]})
    assert engine._reconfigured and engine._default_model() == "m-2"
    argv = engine._argv(Path("/cli"), engine._default_model(), resume=True)
    assert flag(argv, "--allowedTools") == "Read" and flag(argv, "--betas") == "b2"
