"""A conversation's request JSON: each message encoded once, the text sent the same as a fresh
encoding's, nothing kept of messages a request no longer has."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ashd import compact_json
from ashd.bridge.engine import _message_json
from ashd.bridge.engine._cache import cached_messages
from ashd.bridge.engine._message_json import MessageTexts, StaleMessageJson
from ashd.bridge.engine._model_client import encode_request


def _turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {i} – ünïcode"},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"},
                                              {"type": "tool_use", "id": f"t{i}", "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "a\nb"}]}]


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What `compact_json.dumps` was asked to encode."""
    seen: list[Any] = []
    real = compact_json.dumps

    def counting(value: Any) -> str:
        seen.append(value)
        return real(value)

    monkeypatch.setattr(compact_json, "dumps", counting)
    return seen


def test_each_message_is_encoded_once_and_the_request_is_what_a_fresh_encoding_sends(
        encodings: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_message_json.VERIFY_ENV, raising=False)
    texts = MessageTexts()
    assert not texts.verify
    conversation: list[dict[str, Any]] = []
    for i in range(5):
        conversation += _turn(i)
        request = cached_messages(conversation)
        encodings.clear()
        encoded = texts.encoded(request)
        # Only the messages this call has not seen: the new turn's and the marked copies.
        assert len(encodings) <= 3 + 2
        assert all(any(m is e for m in request) for e in encodings)
        assert encoded == request
        body = encode_request({"model": "m", "max_tokens": 5, "messages": encoded})
        assert body == json.dumps({"model": "m", "max_tokens": 5, "messages": request},
                                  separators=(",", ":"), ensure_ascii=False).encode()


def test_messages_a_request_no_longer_has_are_let_go() -> None:
    texts = MessageTexts()
    old = [m for i in range(10) for m in _turn(i)]
    texts.encoded(old)
    summary = [{"role": "user", "content": "summary of what came before"}, *old[-3:]]
    texts.encoded(summary)
    assert texts._messages == summary and all(a is b for a, b in zip(texts._messages, summary, strict=True))
    assert len(texts._texts) == len(summary)


def test_a_message_changed_in_place_is_caught_when_verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_message_json.VERIFY_ENV, "1")
    texts = MessageTexts()
    conversation = _turn(0)
    texts.encoded(conversation)
    conversation[0]["content"] = "changed after it was sent"  # what the engine must never do
    with pytest.raises(StaleMessageJson):
        texts.encoded(conversation)
