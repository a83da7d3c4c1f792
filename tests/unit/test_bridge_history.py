"""history_from_stored: stored rows → Anthropic API messages for a cold resume."""

from __future__ import annotations

from typing import Any

from ashd.bridge.history import close_unanswered_turn, history_from_stored, interrupted_note


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
        # "again" has no result: its turn was cut, and the history says so
        {"role": "assistant", "content": [{"type": "text", "text": interrupted_note()}]},
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
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert out[2]["content"][0]["type"] == "tool_result"
    assert out[2]["content"][0]["is_error"] is True
    assert out[3]["content"] == [{"type": "text", "text": interrupted_note()}]
    assert out[4]["content"] == [{"type": "text", "text": "next"}]  # never merged with "go"


def test_thinking_without_signature_is_dropped() -> None:
    rows = [
        {"type": "user", "content": "q"},
        _assistant([{"type": "thinking", "thinking": "x"}, {"type": "text", "text": "a"}]),
    ]
    assert history_from_stored(rows)[1]["content"][0] == {"type": "text", "text": "a"}


def test_an_unanswered_prompt_is_never_merged_into_the_next_one() -> None:
    rows = [
        {"type": "user", "content": "first"},
        _assistant([{"type": "text", "text": "ok"}]),
        {"type": "result", "subtype": "success", "result": "ok"},
        {"type": "user", "content": "delete everything"},  # the server died here: no answer, no result
        {"type": "user", "content": "what is 2+2?"},
    ]
    out = history_from_stored(rows)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert out[2]["content"] == [{"type": "text", "text": "delete everything"}]
    assert "interrupted" in out[3]["content"][0]["text"]
    assert out[4]["content"] == [{"type": "text", "text": "what is 2+2?"}]


def test_a_failed_turn_is_closed_with_its_reason_and_max_turns_is_not() -> None:
    rows: list[dict[str, Any]] = [
        {"type": "user", "content": "one"},
        {"type": "result", "subtype": "error_during_execution", "is_error": True, "result": "overloaded"},
        {"type": "user", "content": "two"},
        _assistant([{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]),
        {"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}},
        {"type": "result", "subtype": "error_max_turns", "is_error": True, "result": "limit"},
        {"type": "user", "content": "three"},
    ]
    out = history_from_stored(rows)
    assert out[1] == {"role": "assistant", "content": [{"type": "text", "text": interrupted_note("overloaded")}]}
    assert out[2]["content"] == [{"type": "text", "text": "two"}]
    # the turn limit ended "two" properly: "three" follows its tool results, as in the live engine
    assert out[-2]["content"][-1] == {"type": "text", "text": "three"}
    assert out[-1]["role"] == "assistant" and "interrupted" in out[-1]["content"][0]["text"]


def test_close_unanswered_turn_answers_tool_uses_then_notes_the_interruption() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "text", "text": "running"},
                                          {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
    ]
    shared = messages[1]
    close_unanswered_turn(messages, "interrupted by the user", "interrupted by the user")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2]["content"][0]["content"] == "interrupted by the user"
    assert "interrupted by the user" in messages[3]["content"][0]["text"]
    close_unanswered_turn(messages)  # idempotent enough: a note on a note, still alternating
    assert [m["role"] for m in messages][-1] == "assistant"
    assert len(shared["content"]) == 2  # the original assistant message was not mutated
