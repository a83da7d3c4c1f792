"""How busy this process's front end is: the requests in flight and when the last one ended.

Work that can wait, a pool's replacement spare above all (a fork, a sandbox's start, a bridge's
start: tens of ms of CPU on the host), waits for a quiet moment instead of taking the CPU from the
requests beside it. Measured on 2 cores: starting the spare as its claim answered made the session's
first message 17 ms to its first frame and its pause 3.9 ms; started once the requests were done,
12 and 3.0 (`docs/performance.md`, fifth pass). A busy server still gets its spares: the wait is
bounded (`at_most_s`).

`begin` and `end` are called on the event loop only; other threads only read the two fields (each
read is atomic under the GIL), so there is no lock on the request path.
"""

from __future__ import annotations

import threading
import time

QUIET_S = 0.005  # no request in flight for this long: the next one is not already on its way
AT_MOST_S = 0.1  # a spare is started this long after it was asked for at most, busy or not
_POLL_S = 0.004


class Activity:
    def __init__(self, quiet_s: float = QUIET_S, at_most_s: float = AT_MOST_S) -> None:
        self.quiet_s, self.at_most_s = quiet_s, at_most_s
        self._in_flight = 0
        self._last_end = 0.0

    def begin(self) -> None:
        self._in_flight += 1

    def end(self) -> None:
        self._in_flight -= 1
        self._last_end = time.monotonic()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def quiet(self, for_s: float | None = None) -> bool:
        quiet_s = self.quiet_s if for_s is None else for_s
        return self._in_flight <= 0 and time.monotonic() - self._last_end >= quiet_s

    def wait_quiet(self, for_s: float | None = None, at_most_s: float | None = None,
                   stop: threading.Event | None = None) -> bool:
        """Block this (non-loop) thread until no request has been in flight for `for_s` (default
        `quiet_s`), for at most `at_most_s` (default `at_most_s`), or until `stop` is set. True when
        it became quiet."""
        deadline = time.monotonic() + (self.at_most_s if at_most_s is None else at_most_s)
        while not self.quiet(for_s):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if stop is None:
                time.sleep(min(_POLL_S, left))
            elif stop.wait(min(_POLL_S, left)):
                return False
        return True
