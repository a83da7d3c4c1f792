"""Scripts for the fake Messages API: which reply a request gets.

A script is selected by a token contained in the conversation's latest user TEXT message (the
longest matching token wins); the turn index is the number of assistant messages after that user
message. Tool-result-only user messages do not count as "text", so a tool loop stays on its
script; a `sequential` script serves its turns in order instead, one per request it answers.
Error entries (`errors`) are served once each, in order, before the turn's reply, so
"529 then success" is deterministic; `error` fails every attempt.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any


def latest_user_text(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The text of the latest user message that has text, and that message's index (-1 if none)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content, i
        texts = [b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
        if texts:
            return "\n".join(texts), i
    return "", -1


@dataclass
class Script:
    match: str
    turns: list[dict[str, Any]]
    attempts: dict[int, int] = field(default_factory=dict)
    # Sequential: the Nth request the script answers gets turn N, whatever the conversation looks
    # like (an engine that compacts the conversation changes how many assistant turns it shows).
    sequential: bool = False
    served: int = 0


class ScriptBook:
    """Thread-safe: the in-process API may be used from test threads while the server runs."""

    def __init__(self) -> None:
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()

    def register(self, match: str, turns: list[dict[str, Any]], sequential: bool = False) -> None:
        if not match:
            raise ValueError("a script needs a non-empty 'match' token")
        if not isinstance(turns, list):
            raise ValueError("'turns' must be a list")
        with self._lock:
            self._scripts[match] = Script(match, [dict(t) for t in turns], sequential=sequential)

    def clear(self) -> None:
        with self._lock:
            self._scripts.clear()

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"match": s.match, "turns": len(s.turns)} for s in self._scripts.values()]

    def pick(self, body: dict[str, Any]) -> dict[str, Any]:
        """The turn spec for this request (may carry `error`); the echo turn when nothing matches."""
        messages = body.get("messages") or []
        text, index = latest_user_text(messages)
        turn_index = sum(1 for m in messages[index + 1 :] if m.get("role") == "assistant")
        with self._lock:
            hits = [s for s in self._scripts.values() if s.match in text]
            if not hits:
                return {"content": [{"type": "text", "text": f"echo: {text}"}]}
            script = max(hits, key=lambda s: len(s.match))
            if script.sequential:
                turn_index = script.served
            if turn_index >= len(script.turns):
                return {"content": [{"type": "text", "text": f"(script {script.match} has no turn {turn_index})"}]}
            turn = script.turns[turn_index]
            attempt = script.attempts.get(turn_index, 0)
            script.attempts[turn_index] = attempt + 1
            errors = turn.get("errors") or []
            if attempt < len(errors):
                return {"error": errors[attempt]}
            if script.sequential:
                script.served += 1
        return turn


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """Deterministic stand-in for tokenisation: about 4 characters per token."""
    text = json.dumps(body.get("messages") or []) + json.dumps(body.get("system") or "")
    return max(1, len(text) // 4)
