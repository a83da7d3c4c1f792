"""Stored session messages → Anthropic API messages, for a cold resume.

Pure function, no I/O: the server reads the rows from the database and passes the result as
`init.config.history`.
"""

from __future__ import annotations

from typing import Any


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [dict(b) for b in content if isinstance(b, dict)]
    return []


def _clean_assistant(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A thinking block without its signature is refused by the API; drop it rather than fail.
    return [b for b in blocks if not (b.get("type") == "thinking" and not b.get("signature"))]


def history_from_stored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert stored message contents to a valid alternating list of API messages.

    User rows `{"type":"user","content": str | blocks}` and SDK `user` tool-result messages become
    user turns; SDK `assistant` messages become assistant turns (parts of one API message, i.e. the
    same `message.id`, are merged); `result`, `stream_event` and subagent messages (with a
    `parent_tool_use_id`) are skipped. Tool uses left unanswered (an interrupted turn) get an
    error tool_result so that the conversation can continue.
    """
    out: list[dict[str, Any]] = []
    for row in rows:
        if not isinstance(row, dict) or row.get("parent_tool_use_id"):
            continue
        kind = row.get("type")
        if kind == "user":
            inner = row.get("message")
            content = inner.get("content") if isinstance(inner, dict) else row.get("content")
            blocks = _blocks(content)
            if not blocks:
                continue
            _answer_dangling(out, blocks)
            if out and out[-1]["role"] == "user":
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})
        elif kind == "assistant":
            raw = row.get("message")
            msg: dict[str, Any] = raw if isinstance(raw, dict) else {}
            blocks = _clean_assistant(_blocks(msg.get("content")))
            if not blocks:
                continue
            if out and out[-1]["role"] == "assistant":
                # Same API message split over rows, or two assistant rows in a row: merge.
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "assistant", "content": blocks})
    _answer_dangling(out, [])
    return out


def _answer_dangling(out: list[dict[str, Any]], next_user: list[dict[str, Any]]) -> None:
    if not out or out[-1]["role"] != "assistant":
        return
    answered = {b.get("tool_use_id") for b in next_user if b.get("type") == "tool_result"}
    missing = [b["id"] for b in out[-1]["content"] if b.get("type") == "tool_use" and b.get("id") not in answered]
    if missing:
        results = [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": "interrupted: no result was recorded",
                "is_error": True,
            }
            for i in missing
        ]
        if next_user:
            # Tool results must come first in the user turn that follows the tool uses.
            next_user[:0] = results
        else:
            out.append({"role": "user", "content": results})
