"""history_from_stored: stored rows → Anthropic API messages for a cold resume."""

from __future__ import annotations

from typing import Any

from ashd.bridge.history import history_from_stored


def _assistant(content: list[dict[str, Any]], msg_id: str = "msg_1", parent: str | None = None) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"id": msg_id, "role": "assistant", "content": content, "stop_reason": "end_turn"},
        "parent_tool_use_id": parent,
        "session_id": "s",
    }


def test_plain_conversation() -> None:
    rows = [
        {"type": "user", "content": "hello"},
        _assistant([{"type": "text", "text": "hi"}]),
        {"type": "result", "subtype": "success", "result": "hi"},
        {"type": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    assert history_from_stored(rows) == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]


def test_tool_calls_and_results_are_kept_and_subagents_skipped() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}
    rows = [
        {"type": "user", "content": "list"},
        _assistant([use]),
        _assistant([{"type": "text", "text": "inner"}], parent="t0"),
        {"type": "user", "message": {"role": "user", "content": [result]}, "parent_tool_use_id": None},
        _assistant([{"type": "text", "text": "there is a.txt"}], msg_id="msg_2"),
        {"type": "stream_event", "event": {"type": "message_stop"}},
    ]
    out = history_from_stored(rows)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant"]
    assert out[1]["content"] == [use]
    assert out[2]["content"] == [result]


def test_unanswered_tool_use_gets_an_error_result() -> None:
    rows = [
        {"type": "user", "content": "go"},
        _assistant([{"type": "tool_use", "id": "t9", "name": "Bash", "input": {}}]),
        {"type": "user", "content": "next"},
    ]
    out = history_from_stored(rows)
    assert out[2]["role"] == "user"
    assert out[2]["content"][0]["type"] == "tool_result"
    assert out[2]["content"][0]["is_error"] is True
    assert out[2]["content"][1] == {"type": "text", "text": "next"}


def test_thinking_without_signature_is_dropped() -> None:
    rows = [
        {"type": "user", "content": "q"},
        _assistant([{"type": "thinking", "thinking": "x"}, {"type": "text", "text": "a"}]),
    ]
    assert history_from_stored(rows)[1]["content"] == [{"type": "text", "text": "a"}]
