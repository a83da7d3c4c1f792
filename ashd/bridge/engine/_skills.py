"""Skills: `/name args` runs `.agent/skills/<name>.md` (or `.agent/skills/<name>/SKILL.md`)."""

from __future__ import annotations

import re
from pathlib import Path

_COMMAND = re.compile(r"^/([A-Za-z0-9][A-Za-z0-9_.:-]*)(?:\s+(.*))?$", re.DOTALL)


def _strip_front_matter(text: str) -> str:
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end >= 0:
            return text[end + 4 :].lstrip("\n")
    return text


def expand_skill(workspace: Path, prompt: str) -> str | None:
    """The prompt a skill command stands for, or None when it is not a known skill."""
    match = _COMMAND.match(prompt.strip())
    if not match:
        return None
    name, args = match.group(1), (match.group(2) or "").strip()
    skills = workspace / ".agent" / "skills"
    for candidate in (skills / f"{name}.md", skills / name / "SKILL.md"):
        if candidate.is_file():
            text = _strip_front_matter(candidate.read_text(errors="replace"))
            if "$ARGUMENTS" in text:
                return text.replace("$ARGUMENTS", args)
            return f"{text.rstrip()}\n\n{args}" if args else text
    return None
