"""Prompt-cache breakpoints and compaction planning: pure functions of the conversation."""

from __future__ import annotations

import json
from typing import Any

from ashd.bridge.engine._cache import cached_messages, cached_system, cached_tools
from ashd.bridge.engine._compact import SUMMARY_HEADER, Measure, needs_compaction, plan, summary_request, summary_text
from ashd.bridge.history import apply_compaction, history_from_stored, summary_message
from ashd.devtools._fake_cache import PromptCache, count_breakpoints
from ashd.model_names import LONG_CONTEXT_BETA, context_window


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def tool_turn(tool_id: str, output: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": output}]}]


def marks(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if isinstance(m["content"], list)
            and any("cache_control" in b for b in m["content"])]


def test_breakpoints_go_on_copies_and_skip_unmarkable_blocks() -> None:
    convo = [user("q1"), {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                           {"type": "thinking", "thinking": "t", "signature": "s"}]},
             user("q2"), assistant("a2"), {"role": "user", "content": [{"type": "text", "text": ""}]}]
    before = json.dumps(convo)
    out = cached_messages(convo)
    assert json.dumps(convo) == before  # the conversation itself is untouched
    # The last message has only an empty text block: it cannot carry a mark, so the two marks go
    # on the user turns before it.
    assert marks(out) == [0, 2]
    assert out[2]["content"] == [{"type": "text", "text": "q2", "cache_control": {"type": "ephemeral"}}]
    assert cached_system(None) is None and cached_tools([]) == []
    tools = cached_tools([{"name": "A"}, {"name": "B"}])
    assert [("cache_control" in t) for t in tools] == [False, True]
    body = {"system": cached_system("s"), "tools": tools, "messages": out}
    assert count_breakpoints(body) == 4


def test_fake_cache_reads_what_an_earlier_request_wrote() -> None:
    cache = PromptCache()
    first = {"system": cached_system("sys " * 100), "messages": cached_messages([user("hello " * 100)])}
    uncached, created, read = cache.account(first, 1000)
    assert read == 0 and created > 0 and uncached + created == 1000
    second = {"system": cached_system("sys " * 100),
              "messages": cached_messages([user("hello " * 100), assistant("hi"), user("more")])}
    _, _, read = cache.account(second, 1200)
    assert read >= created


def test_plan_cuts_before_an_assistant_turn_and_keeps_tool_pairs() -> None:
    convo = [user("REQ do it"), *tool_turn("t1", "x" * 4000), *tool_turn("t2", "y" * 4000), *tool_turn("t3", "z" * 400)]
    p = plan(convo, keep_tokens=300)
    assert p is not None
    assert convo[p.cut]["role"] == "assistant" and p.cut == 5  # the t3 call and its result
    assert p.request == "REQ do it"
    roomy = plan(convo, keep_tokens=10_000)
    assert roomy is not None and roomy.cut == 1 and roomy.request == "REQ do it"
    assert plan([user("only a prompt")], 100) is None
    # A conversation that is already just a summary and one turn is not summarised again.
    assert plan([summary_message(summary_text("s", 3, None)), *tool_turn("t4", "w")], 1) is None


def test_summary_request_ends_with_the_instruction_and_trims_big_blocks() -> None:
    older = [user("q"), *tool_turn("t1", "x" * 50_000)]
    req = summary_request(older)
    assert req[-1]["role"] == "user"
    assert req[-1]["content"][0]["type"] == "tool_result"  # results stay first in their user turn
    assert req[-1]["content"][-1]["text"].startswith("Summarise")
    assert len(json.dumps(req)) < 30_000


def test_measure_and_threshold() -> None:
    m = Measure()
    convo = [user("a" * 4000)]
    assert m.estimate(convo, fixed=100) == 100 + len(json.dumps(convo)) // 4
    m.record(convo, {"input_tokens": 10, "cache_read_input_tokens": 990, "output_tokens": 0})
    convo.append(assistant("b" * 400))
    assert m.estimate(convo, fixed=100) == 1000 + len(json.dumps(convo[1:])) // 4
    assert needs_compaction(150_000, 32_000, 200_000) and not needs_compaction(100_000, 8_000, 200_000)
    assert context_window("claude-sonnet-4-5-20250929", []) == 200_000
    assert context_window("sonnet", [LONG_CONTEXT_BETA]) == 1_000_000
    assert context_window("some-other-model", [], unknown=32_000) == 32_000


def test_cold_history_applies_a_stored_compaction_and_ignores_one_that_does_not_fit() -> None:
    text = summary_text("what happened", 3, "REQ do it")
    rows: list[dict[str, Any]] = [
        {"type": "user", "content": "REQ do it"},
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "tool_use", "id": "t1", "name": "B", "input": {}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "o"}]}},
        {"type": "assistant", "message": {"id": "m2", "content": [{"type": "tool_use", "id": "t2", "name": "B", "input": {}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t2", "content": "o"}]}},
        {"type": "system", "subtype": "compact_boundary", "compaction": {"summary": text, "keptMessages": 2}},
        {"type": "assistant", "message": {"id": "m3", "content": [{"type": "text", "text": "done"}]}},
        {"type": "result", "subtype": "success"},
    ]
    history = history_from_stored(rows)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[0]["content"][0]["text"].startswith(SUMMARY_HEADER.format(count=3))
    assert history[1]["content"][0]["id"] == "t2"
    full = [user("a"), assistant("b")]
    apply_compaction(full, {"summary": text, "keptMessages": 5})
    assert full == [user("a"), assistant("b")]
    apply_compaction(full, {"summary": text, "keptMessages": 2})  # would start with a user turn
    assert full == [user("a"), assistant("b")]


def test_tool_definitions_are_built_once_per_set_of_tools_and_sent_as_built() -> None:
    from ashd.bridge.engine._compact import estimate_tokens
    from ashd.bridge.engine._tool_defs import tool_defs
    from ashd.bridge.engine.tools import builtin_tools

    first = tool_defs(builtin_tools())
    assert tool_defs(builtin_tools()) is first  # new instances of the same tools: the same definitions
    assert json.loads(first.request.json) == list(first.request)
    assert list(first.request) == cached_tools([{"name": t.name, "description": t.description,
                                                  "input_schema": t.input_schema} for t in builtin_tools()])
    assert first.tokens == estimate_tokens([[t.description, t.input_schema] for t in builtin_tools()])

    class Mcp:  # a tool whose schema is made anew: another set, built again
        name, description = "mcp__s__t", "a tool"

        def __init__(self, schema: dict[str, Any]) -> None:
            self.input_schema = schema

    one = tool_defs([*builtin_tools(), Mcp({"type": "object"})])  # type: ignore[list-item]
    other = tool_defs([*builtin_tools(), Mcp({"type": "object", "properties": {"x": {"type": "string"}}})])  # type: ignore[list-item]
    assert one is not first and other is not one
    assert other.request[-1]["input_schema"]["properties"] == {"x": {"type": "string"}}
    assert other.request[-1]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in other.request[0]
