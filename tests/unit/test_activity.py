"""`Activity`: what the pool's spares wait for (a quiet moment), with real threads and clocks."""

from __future__ import annotations

import asyncio
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
    ended: list[float] = []

    def end() -> None:
        ended.append(time.monotonic())
        activity.end()

    threading.Timer(0.1, end).start()
    assert activity.wait_quiet(for_s=0.01, at_most_s=30.0) is True  # True: quiet, not given up
    assert ended and time.monotonic() >= ended[0] + 0.01  # not before the request ended, and a quiet moment


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


# --- bound to the loop: the loop says when it is quiet; nothing polls ----------------------------

async def test_the_loop_calls_back_once_the_last_request_has_been_over_for_the_quiet_time() -> None:
    activity = Activity(quiet_s=0.02, at_most_s=30.0, loop=asyncio.get_running_loop())
    told: list[tuple[bool, float]] = []
    activity.begin()
    activity.when_quiet(lambda quiet: told.append((quiet, time.monotonic())))
    await asyncio.sleep(0.1)
    assert told == []  # a request in flight: not quiet, however long
    activity.end()
    activity.begin()  # another one comes and goes: the quiet time counts from its end
    await asyncio.sleep(0.01)
    activity.end()
    ended = time.monotonic()
    for _ in range(200):
        if told:
            break
        await asyncio.sleep(0.005)
    assert [quiet for quiet, _ in told] == [True]
    assert told[0][1] - ended >= 0.02 - 0.002  # the loop's timers may be a millisecond early; quiet() is not


async def test_a_busy_loop_still_calls_back_at_the_bound() -> None:
    activity = Activity(quiet_s=0.01, at_most_s=0.1, loop=asyncio.get_running_loop())
    told: list[bool] = []
    activity.begin()  # a stream that stays open
    started = time.monotonic()
    activity.when_quiet(told.append)
    while not told:
        assert time.monotonic() - started < 5.0
        await asyncio.sleep(0.01)
    assert told == [False] and time.monotonic() - started >= 0.1 - 0.002
    activity.end()
    await asyncio.sleep(0.05)
    assert told == [False]  # called once


async def test_a_thread_waits_without_polling_and_is_woken_by_the_loop_or_by_wake() -> None:
    loop = asyncio.get_running_loop()
    activity = Activity(quiet_s=0.01, at_most_s=30.0, loop=loop)
    activity.begin()
    waiting = asyncio.ensure_future(asyncio.to_thread(activity.wait_quiet))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    activity.end()
    assert await asyncio.wait_for(waiting, 10.0) is True

    activity.begin()
    hurry = threading.Event()
    waiting = asyncio.ensure_future(asyncio.to_thread(activity.wait_quiet, stop=hurry))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    hurry.set()
    activity.wake()  # what the pool does when a claim finds no spare
    assert await asyncio.wait_for(waiting, 10.0) is False
    activity.end()


async def test_when_quiet_from_another_thread() -> None:
    activity = Activity(quiet_s=0.005, at_most_s=30.0, loop=asyncio.get_running_loop())
    told = asyncio.Event()
    await asyncio.to_thread(activity.when_quiet, lambda quiet: told.set())
    await asyncio.wait_for(told.wait(), 10.0)
