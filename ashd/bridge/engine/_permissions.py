"""Which tools are offered to the model and which calls may run.

Patterns are the Agent SDK's: `Read` (a tool name, globs allowed: `mcp__github__*`) or
`Bash(git *)` (a tool name plus a glob on the call's main argument: the command for Bash, the
file path for Read/Write/Edit, the pattern for Glob/Grep, the subagent type for Task).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

_MAIN_ARG = {
    "Bash": "command",
    "Read": "file_path",
    "Write": "file_path",
    "Edit": "file_path",
    "Glob": "pattern",
    "Grep": "pattern",
    "Task": "subagent_type",
}
_READ_ONLY = frozenset({"Read", "Glob", "Grep"})
BYPASS_MODES = frozenset({"bypassPermissions", ""})


@dataclass(frozen=True)
class Rule:
    tool: str
    spec: str | None

    @classmethod
    def parse(cls, text: str) -> Rule:
        text = text.strip()
        if text.endswith(")") and "(" in text:
            name, _, rest = text.partition("(")
            return cls(name.strip(), rest[:-1])
        return cls(text, None)

    def matches_name(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.tool)

    def matches_call(self, name: str, args: dict[str, Any]) -> bool:
        if not self.matches_name(name):
            return False
        if self.spec is None or self.spec in ("", "*"):
            return True
        key = _MAIN_ARG.get(name)
        value = args.get(key) if key else None
        subject = value if isinstance(value, str) else json.dumps(args, sort_keys=True)
        return fnmatch.fnmatchcase(subject, self.spec)


class Permissions:
    def __init__(
        self,
        mode: str,
        allow: list[str],
        deny: list[str],
        allowed_tools: list[str],
        disallowed_tools: list[str],
    ) -> None:
        self.mode = mode
        self._allow = [Rule.parse(r) for r in allow]
        self._deny = [Rule.parse(r) for r in deny]
        self._whitelist = [Rule.parse(r) for r in allowed_tools]
        self._blacklist = [Rule.parse(r) for r in disallowed_tools]

    def offered(self, name: str) -> bool:
        """Whether the tool is shown to the model at all (allowedTools/disallowedTools)."""
        if any(r.spec is None and r.matches_name(name) for r in self._blacklist):
            return False
        return not self._whitelist or any(r.matches_name(name) for r in self._whitelist)

    def check(self, name: str, args: dict[str, Any]) -> str | None:
        """None if the call may run, else the reason it was refused."""
        if not self.offered(name):
            return f"Permission denied: {name} was refused by permissions (disallowed in this session)"
        if any(r.matches_call(name, args) for r in self._blacklist + self._deny):
            return f"Permission denied: this {name} call is blocked by disallowedTools/permissions.deny"
        if self._whitelist and not any(r.matches_call(name, args) for r in self._whitelist):
            return f"Permission denied: this {name} call is not in allowedTools"
        if self.mode in BYPASS_MODES:
            return None
        if self.mode == "plan":
            return None if name in _READ_ONLY else f"Permission denied: {name} is not allowed in plan mode"
        if self.mode == "acceptEdits" and name in ("Write", "Edit"):
            return None
        # default / permissionsByAgent: no interactive approver, so only listed calls run.
        if any(r.matches_call(name, args) for r in self._allow):
            return None
        return (
            f"Permission denied: {name} was refused by permissions (not matched by "
            ".agent/settings.json permissions.allow)"
        )
