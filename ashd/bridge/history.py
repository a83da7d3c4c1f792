"""Stored session messages → Anthropic API messages, for a cold resume; and how a turn that did
not finish is closed, here and in the live engine.

Pure functions, no I/O: the server reads the rows from the database and passes the result as
`init.config.history`.

A turn cut short (server killed, sandbox crashed, interrupted, the model call failed) leaves a
user prompt the model never answered. Merged into the next user message it would be asked again,
tool calls included. So such a turn is closed in the history: its unanswered tool uses get an
error result and an assistant note says the turn was interrupted, and the next prompt stands alone.
"""

from __future__ import annotations

from typing import Any

NO_RESULT = "interrupted: no result was recorded"


def interrupted_note(reason: str | None = None) -> str:
    why = f" ({reason})" if reason else ""
    return (f"[This turn was interrupted before it finished{why}. What it asked for was not completed; "
            "do not carry it out now unless the user asks for it again.]")


def attachments_note(attachments: list[dict[str, Any]], *, resumed: bool = False) -> str:
    """The text a prompt's attachments add for the model: where each file is in the workspace, and
    whether it is shown inline (images and PDFs within the model's limits are). On a cold resume the
    inline content is not sent again (it would be re-read from the database for every resume): the
    note says so, and the files are still in the workspace."""
    parts = []
    for a in attachments:
        inline = bool(a.get("shownToModel")) and not resumed
        parts.append(f"{a.get('path')} ({a.get('mimeType')}, {a.get('size')} bytes"
                     f"{'' if inline else '; not shown inline, read the file to see it'})")
    return "[Attached by the user, saved in the workspace: " + "; ".join(parts) + "]"


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [dict(b) for b in content if isinstance(b, dict)]
    return []


def _clean_assistant(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A thinking block without its signature is refused by the API; drop it rather than fail.
    return [b for b in blocks if not (b.get("type") == "thinking" and not b.get("signature"))]


def summary_message(text: str) -> dict[str, Any]:
    """The user turn that stands for a compacted part of the conversation (engine/_compact.py)."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def apply_compaction(out: list[dict[str, Any]], compaction: dict[str, Any]) -> None:
    """Apply a stored compaction to the conversation rebuilt up to it: the same summary, then the
    same last `keptMessages`. A record that does not fit what was rebuilt is ignored, which shows
    the model more, never less."""
    kept = compaction.get("keptMessages")
    text = compaction.get("summary")
    if not isinstance(kept, int) or not isinstance(text, str) or not 0 < kept <= len(out):
        return
    if out[-kept].get("role") != "assistant":
        return
    out[:] = [summary_message(text), *out[-kept:]]


def _failed(result: dict[str, Any]) -> bool:
    # A turn stopped by its turn limit did answer; any other error result means it did not finish.
    return bool(result.get("is_error")) and result.get("subtype") != "error_max_turns"


def history_from_stored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert stored message contents to a valid alternating list of API messages.

    User rows `{"type":"user","content": str | blocks[, "attachments": [...]]}` (prompts; their
    attachments become a note, `attachments_note`) and SDK `user` tool-result
    messages become user turns; SDK `assistant` messages become assistant turns (parts of one API
    message, i.e. the same `message.id`, are merged); `result`, `stream_event` and subagent
    messages (with a `parent_tool_use_id`) are skipped. A `compact_boundary` system message (the
    engine compacted the conversation) replaces what came before it with its summary, keeping its
    last `keptMessages` as they are, as the engine did. A prompt whose turn has no successful
    `result` (the last one included) is closed with `close_unanswered_turn`, so a later prompt is
    never merged into it.
    """
    out: list[dict[str, Any]] = []
    open_turn = False  # a prompt was seen and its turn has not ended with a result yet
    for row in rows:
        if not isinstance(row, dict) or row.get("parent_tool_use_id"):
            continue
        kind = row.get("type")
        if kind == "user":
            inner = row.get("message")
            prompt = not isinstance(inner, dict)
            content = inner.get("content") if isinstance(inner, dict) else row.get("content")
            blocks = _blocks(content)
            attached = row.get("attachments") if prompt else None
            if isinstance(attached, list) and attached:
                blocks.insert(0, {"type": "text", "text": attachments_note(attached, resumed=True)})
            if not blocks:
                continue
            if prompt and open_turn:
                close_unanswered_turn(out)
            _answer_dangling(out, blocks)
            if out and out[-1]["role"] == "user":
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})
            open_turn = open_turn or prompt
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
        elif kind == "system" and row.get("subtype") == "compact_boundary":
            compaction = row.get("compaction")
            if isinstance(compaction, dict):
                apply_compaction(out, compaction)
        elif kind == "result" and open_turn:
            if _failed(row):
                result = row.get("result")
                close_unanswered_turn(out, str(result)[:500] if result else None)
            open_turn = False
    if open_turn:
        close_unanswered_turn(out)
    _answer_dangling(out, [])
    return out


def close_unanswered_turn(messages: list[dict[str, Any]], reason: str | None = None,
                          tool_result: str = NO_RESULT) -> None:
    """End a turn that did not finish: unanswered tool uses get an error result (`tool_result`),
    then an assistant note says the turn was interrupted. Used by the cold history above and by the
    live engine after an interrupt or a failure, so both show the model the same conversation."""
    if not messages:
        return
    if messages[-1]["role"] == "assistant":
        _answer_dangling(messages, [], tool_result)
    note = {"type": "text", "text": interrupted_note(reason)}
    last = messages[-1]
    if last["role"] == "assistant":
        # A new dict: the old one may be shared with a message already handed to the client.
        messages[-1] = {**last, "content": [*_blocks(last["content"]), note]}
    else:
        messages.append({"role": "assistant", "content": [note]})


def _answer_dangling(out: list[dict[str, Any]], next_user: list[dict[str, Any]], text: str = NO_RESULT) -> None:
    if not out or out[-1]["role"] != "assistant":
        return
    answered = {b.get("tool_use_id") for b in next_user if b.get("type") == "tool_result"}
    missing = [b["id"] for b in _blocks(out[-1]["content"])
               if b.get("type") == "tool_use" and b.get("id") not in answered]
    if missing:
        results = [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": text,
                "is_error": True,
            }
            for i in missing
        ]
        if next_user:
            # Tool results must come first in the user turn that follows the tool uses.
            next_user[:0] = results
        else:
            out.append({"role": "user", "content": results})
