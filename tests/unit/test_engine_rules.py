"""Engine rules without a model: permissions, skills, cost."""

from __future__ import annotations

from pathlib import Path

from ashd.bridge.engine._permissions import Permissions
from ashd.bridge.engine._skills import expand_skill
from ashd.pricing import estimate_cost


def test_bypass_allows_everything_offered() -> None:
    perms = Permissions("bypassPermissions", [], [], [], ["Bash"])
    assert perms.check("Read", {"file_path": "x"}) is None
    assert not perms.offered("Bash")
    refusal = perms.check("Bash", {"command": "ls"})
    assert refusal is not None
    assert "refused by permissions" in refusal


def test_permissions_by_agent_uses_allow_patterns() -> None:
    perms = Permissions("permissionsByAgent", ["Read", "Bash(git *)", "mcp__github__*"], [], [], [])
    assert perms.check("Read", {"file_path": "a"}) is None
    assert perms.check("Bash", {"command": "git status"}) is None
    assert perms.check("Bash", {"command": "rm -rf /"}) is not None
    assert perms.check("mcp__github__create_issue", {}) is None
    assert perms.check("Write", {"file_path": "a"}) is not None
    assert Permissions("default", ["Read"], [], [], []).check("Write", {}) is not None


def test_allowed_tools_whitelist_and_blacklist_wins() -> None:
    perms = Permissions("bypassPermissions", [], [], ["Read", "Bash"], ["Bash"])
    assert perms.offered("Read")
    assert not perms.offered("Write")
    assert not perms.offered("Bash")


def test_skill_expansion(tmp_path: Path) -> None:
    skills = tmp_path / ".agent" / "skills"
    skills.mkdir(parents=True)
    (skills / "greet.md").write_text("---\nname: greet\n---\nSay hello to $ARGUMENTS.")
    (skills / "plain.md").write_text("Do the plain thing.")
    assert expand_skill(tmp_path, "/greet Bob") == "Say hello to Bob."
    assert expand_skill(tmp_path, "/plain with args") == "Do the plain thing.\n\nwith args"
    assert expand_skill(tmp_path, "/unknown x") is None
    assert expand_skill(tmp_path, "no slash") is None


def test_cost_estimate_per_family() -> None:
    usage = {"input_tokens": 1_000_000, "output_tokens": 1_000_000}
    assert estimate_cost("claude-sonnet-4-5", usage) == 18.0
    assert estimate_cost("claude-haiku-4-5", usage) == 6.0
    assert estimate_cost("claude-opus-4-1", usage) == 90.0
    # An unknown model is priced as the most expensive family (opus 4/4.1), never below it.
    assert estimate_cost("unknown", {"cache_read_input_tokens": 1_000_000}) == 1.5
