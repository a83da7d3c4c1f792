"""How busy this process's front end is: the requests in flight and when the last one ended.

Work that can wait, a pool's replacement spare above all (a fork, a sandbox's start, a bridge's
start: tens of ms of CPU on the host), waits for a quiet moment instead of taking the CPU from the
requests beside it. Measured on 2 cores: starting the spare as its claim answered made the session's
first message 17 ms to its first frame and its pause 3.9 ms; started once the requests were done,
12 and 3.0 (`docs/performance.md`, fifth pass). A busy server still gets its spares: the wait is
bounded (`at_most_s`).

`begin` and `end` are called on the event loop only; other threads only read the two fields (each
read is atomic under the GIL), so there is no lock on the request path.

Bound to the loop (`loop=`, as the server runs it), the loop itself says when it is quiet: a wait
is a timer there, looked at again when the last request in flight ends, and a waiting thread sleeps
until the loop wakes it. Nothing polls: on these virtual machines each wake-up of an idle thread
costs more than the work it does, and a thread that woke every few milliseconds to look took the
interpreter lock from the requests it was waiting on (docs/performance.md, nineteenth pass).
Unbound (tests that drive it from plain threads), a waiting thread looks every `_POLL_S`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

QUIET_S = 0.005  # no request in flight for this long: the next one is not already on its way
AT_MOST_S = 0.1  # a spare is started this long after it was asked for at most, busy or not
_POLL_S = 0.004
_MIN_LOOK_S = 0.001  # the loop's timers may fire up to a millisecond early (uvloop's clock)


class _Waiter:
    __slots__ = ("fn", "timer")

    def __init__(self, fn: Callable[[bool], None]) -> None:
        self.fn = fn
        self.timer: asyncio.TimerHandle | None = None


class Activity:
    def __init__(self, quiet_s: float = QUIET_S, at_most_s: float = AT_MOST_S,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.quiet_s, self.at_most_s = quiet_s, at_most_s
        self._in_flight = 0
        self._last_end = 0.0
        self._loop = loop
        self._waiters: list[_Waiter] = []  # the loop's alone
        self._look_timer: asyncio.TimerHandle | None = None
        self._sleepers: set[threading.Event] = set()  # threads in `wait_quiet`, woken by `wake`
        self._lock = threading.Lock()

    def begin(self) -> None:
        self._in_flight += 1

    def end(self) -> None:
        self._in_flight -= 1
        self._last_end = time.monotonic()
        if self._waiters and self._in_flight <= 0:
            self._look_in(self.quiet_s)

    @property
    def bound(self) -> bool:
        """The loop says when it is quiet (`when_quiet`); else threads poll (`wait_quiet`)."""
        return self._loop is not None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def quiet(self, for_s: float | None = None) -> bool:
        quiet_s = self.quiet_s if for_s is None else for_s
        return self._in_flight <= 0 and time.monotonic() - self._last_end >= quiet_s

    # --- on the loop -------------------------------------------------------------------------------
    def when_quiet(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(True)` on the loop once no request has been in flight for `quiet_s`, or `fn(False)`
        `at_most_s` from now if it is still busy then. From any thread; needs the loop (`loop=`).
        RuntimeError when the loop is closed (the server is stopping): `fn` is never called."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("Activity.when_quiet needs the loop the requests run on")
        deadline = time.monotonic() + self.at_most_s
        if asyncio._get_running_loop() is loop:
            self._add(fn, deadline)
        else:
            loop.call_soon_threadsafe(self._add, fn, deadline)

    def _add(self, fn: Callable[[bool], None], deadline: float) -> None:
        assert self._loop is not None
        waiter = _Waiter(fn)
        waiter.timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._give_up, waiter)
        self._waiters.append(waiter)
        if self._in_flight <= 0:
            self._look_in(self._last_end + self.quiet_s - time.monotonic())

    def _look_in(self, delay: float) -> None:
        assert self._loop is not None
        if self._look_timer is not None:
            self._look_timer.cancel()
        self._look_timer = self._loop.call_later(max(delay, 0.0), self._look)

    def _look(self) -> None:
        self._look_timer = None
        if self.quiet():
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if waiter.timer is not None:
                    waiter.timer.cancel()
                waiter.fn(True)
        elif self._in_flight <= 0:  # the timer fired a little early, or a request came and went
            self._look_in(max(self._last_end + self.quiet_s - time.monotonic(), _MIN_LOOK_S))
        # else: the end of the last request in flight looks again

    def _give_up(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            waiter.fn(False)

    # --- from other threads --------------------------------------------------------------------------
    def wait_quiet(self, for_s: float | None = None, at_most_s: float | None = None,
                   stop: threading.Event | None = None) -> bool:
        """Block this (non-loop) thread until no request has been in flight for `for_s` (default
        `quiet_s`), for at most `at_most_s` (default `at_most_s`), or until `stop` is set (bound to a
        loop, whoever sets `stop` calls `wake` too). True when it became quiet."""
        if self._loop is None or for_s is not None or at_most_s is not None:
            return self._poll_quiet(for_s, at_most_s, stop)
        woken = threading.Event()
        outcome = [False]

        def settle(quiet: bool) -> None:  # on the loop
            outcome[0] = quiet
            woken.set()

        with self._lock:
            self._sleepers.add(woken)
        try:
            if stop is not None and stop.is_set():
                return False
            try:
                self.when_quiet(settle)
            except RuntimeError:  # the loop is closed: nothing to wait for
                return False
            woken.wait(self.at_most_s + 1.0)  # the loop's own timer comes first; this, if it stopped
        finally:
            with self._lock:
                self._sleepers.discard(woken)
        return outcome[0] and not (stop is not None and stop.is_set())

    def wake(self) -> None:
        """Let every thread in `wait_quiet` go now (a claim needs its spare; the pool stops)."""
        with self._lock:
            for woken in self._sleepers:
                woken.set()

    def _poll_quiet(self, for_s: float | None, at_most_s: float | None, stop: threading.Event | None) -> bool:
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
