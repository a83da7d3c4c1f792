"""A conversation's messages as request JSON, each message encoded once.

Every model call sends the whole conversation, and the conversation only grows: its messages are
new dicts when they change (`append_user`, `close_unanswered_turn`, the prompt cache's marks on
copies), never changed in place. Encoding all of it again on each call cost the bridge 0.65 ms
per call at 123 KiB of conversation, two thirds of its CPU on a long one (py-spy; the cost grows
with the conversation, on every call of every tool loop: docs/performance.md, thirtieth pass).
`MessageTexts` keeps each message's JSON, known by the message object itself, from one call to
the next; a message it has not seen in that place (a new one, a marked copy) is encoded then.

A message changed in place after it was encoded would be sent as it was: with
`ASHD_VERIFY_REQUEST_JSON=1` (the test suite sets it) every request's messages are encoded again
and compared, and a difference fails the call.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from ashd import compact_json
from ashd.bridge.engine._model_client import EncodedList

VERIFY_ENV = "ASHD_VERIFY_REQUEST_JSON"


class StaleMessageJson(AssertionError):
    """A message of the conversation was changed in place after it was encoded."""


class MessageTexts:
    """One conversation's encoded messages: those of its last request, in its order. A request
    extends the one before it (the same message objects, then new ones), so what it shares with it
    is found by identity at C speed (`map(operator.is_, ...)`), with no Python step per message:
    only the messages after that are looked at one by one, and those the last request did not have
    encoded (the marked copies, what the turn added). The messages kept are held, so none of them
    can be another object by the time it is compared."""

    def __init__(self) -> None:
        self._messages: list[dict[str, Any]] = []
        self._texts: list[str] = []
        self.verify = os.environ.get(VERIFY_ENV) == "1"

    def encoded(self, messages: list[dict[str, Any]]) -> EncodedList:
        """`messages` (a request's list) with its JSON text, from the texts kept where they are."""
        dumps = compact_json.dumps
        same = list(map(operator.is_, messages, self._messages))
        try:
            shared = same.index(False)
        except ValueError:
            shared = len(same)
        texts = self._texts[:shared]
        # After the shared part, the last request's own messages may still come again, in another
        # place: the originals of its marked copies moved a mark on, what came between them kept.
        earlier = {id(m): (m, text) for m, text in zip(self._messages[shared:], self._texts[shared:], strict=True)}
        for message in messages[shared:]:
            entry = earlier.get(id(message))
            texts.append(entry[1] if entry is not None and entry[0] is message else dumps(message))
        self._messages, self._texts = list(messages), texts
        out = EncodedList(messages)
        out.json = "[" + ",".join(texts) + "]"
        if self.verify and out.json != dumps(messages):
            raise StaleMessageJson("a message of the conversation was changed in place after it was encoded")
        return out
