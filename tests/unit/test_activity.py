"""`Activity`: what the pool's spares wait for (a quiet moment), with real threads and clocks."""

from __future__ import annotations

import threading
import time

from ashd.actors import Activity


def test_quiet_only_once_nothing_is_in_flight_for_the_quiet_time() -> None:
    activity = Activity()
    assert activity.quiet(0.05)  # a server that never had a request is quiet
    activity.begin()
    activity.begin()
    activity.end()
    assert activity.in_flight == 1 and not activity.quiet(0.0)
    activity.end()
    assert activity.in_flight == 0
    assert not activity.quiet(0.05)  # the last request just ended: the next may be on its way
    time.sleep(0.06)
    assert activity.quiet(0.05)


def test_a_waiter_goes_on_when_the_requests_end() -> None:
    activity = Activity()
    activity.begin()
    threading.Timer(0.1, activity.end).start()
    started = time.monotonic()
    assert activity.wait_quiet(for_s=0.01, at_most_s=5.0) is True
    waited = time.monotonic() - started
    assert 0.1 <= waited < 2.0


def test_a_waiter_gives_up_on_a_server_that_stays_busy() -> None:
    activity = Activity()
    activity.begin()  # a stream that stays open
    started = time.monotonic()
    assert activity.wait_quiet(for_s=0.01, at_most_s=0.1) is False
    assert 0.1 <= time.monotonic() - started < 2.0


def test_a_waiter_is_let_go_by_its_stop_event() -> None:
    activity = Activity()
    activity.begin()
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    started = time.monotonic()
    assert activity.wait_quiet(for_s=0.01, at_most_s=30.0, stop=stop) is False
    assert time.monotonic() - started < 5.0
