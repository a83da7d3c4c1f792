"""The asyncio↔pykka bridge: replies arrive without blocking the loop; timeouts and errors map."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pykka
import pytest

from ashd.actors._aio import AioActor, AioFuture, Later, call
from ashd.actors._staged import OnLoop, Stage, StagedActor, staged
from ashd.errors import Conflict, Unavailable


class Slow(AioActor):
    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def work(self, value: int) -> int:
        self.gate.wait(5)
        return value * 2

    def fail(self) -> None:
        raise ValueError("boom")


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()
    pykka.ActorRegistry.stop_all()


async def test_loop_keeps_running_while_the_actor_works(gate: threading.Event) -> None:
    proxy = Slow.start(gate).proxy()
    future = proxy.work(21)
    assert isinstance(future, AioFuture)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not gate.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    async with asyncio.timeout(30):  # the loop runs while the actor is busy: it cannot return before `gate`
        while ticks <= 5:
            await asyncio.sleep(0.001)
    assert future.aio is not None and not future.aio.done()
    gate.set()
    assert await call(future, 5) == 42
    await task


async def test_exceptions_reach_the_caller_and_timeouts_are_unavailable(gate: threading.Event) -> None:
    proxy = Slow.start(gate).proxy()
    with pytest.raises(ValueError, match="boom"):
        await call(proxy.fail(), 5)
    with pytest.raises(Unavailable):
        await call(proxy.work(1), 0.05)


async def test_dead_actor_is_unavailable(gate: threading.Event) -> None:
    ref = Slow.start(gate)
    proxy = ref.proxy()
    ref.stop()
    with pytest.raises(Unavailable):
        await call(proxy.work(1), 1)


async def test_a_plain_future_never_answered_frees_its_waiting_thread_soon_after_the_timeout() -> None:
    """A future of a non-Aio actor is waited for in one of the loop's executor threads (six on two
    CPUs): one that is never answered must not keep it, or enough of them stop every `to_thread`."""
    never: pykka.ThreadingFuture[int] = pykka.ThreadingFuture()
    with pytest.raises(Unavailable):
        await call(never, 0.2)

    def waiting_in_get() -> int:
        return sum(1 for frame in sys._current_frames().values()
                   if any(f.name == "get" and "pykka" in f.filename for f in traceback.extract_stack(frame)))

    for _ in range(40):  # up to 2 s: the thread gives up 1 s after the call did
        if waiting_in_get() == 0:
            break
        await asyncio.sleep(0.05)
    assert waiting_in_get() == 0


def test_off_loop_futures_are_plain(gate: threading.Event) -> None:
    gate.set()
    proxy = Slow.start(gate).proxy()
    future = proxy.work(2)
    assert future.get(timeout=5) == 4


# --- staged handlers: the actor never waits for the loop, yet answers one request at a time -----

class Counter(StagedActor):
    """A toy staged actor: `add` stores its value through the loop (a gate holds the 'database')."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gate: asyncio.Event) -> None:
        super().__init__(loop, stage_timeout=5)
        self.gate = gate
        self.total = 0
        self.log: list[str] = []
        self.threads: set[str] = set()

    async def _store(self, value: int) -> int:
        await self.gate.wait()
        return self.total + value

    @staged
    def add(self, value: int) -> Stage[int]:
        self.log.append(f"start {value}")
        self.threads.add(threading.current_thread().name)
        self.total = yield self._store(value)
        self.log.append(f"end {value}")
        return self.total

    @staged
    def fail_then_recover(self) -> Stage[str]:
        try:
            yield OnLoop(asyncio.sleep(5), timeout=0.05)
        except TimeoutError:
            return "recovered"  # the stage's error is raised in the handler, which decides
        return "not reached"

    @staged
    def later(self) -> Stage[Later[str]]:
        yield from ()
        answer: Later[str] = Later()
        self.pending = answer
        return answer

    @staged
    def resolve(self, value: str) -> Stage[None]:
        yield from ()
        self.pending.set_result(value)

    @staged
    def add_in_thread(self, pool: concurrent.futures.Executor, gate: threading.Event, value: int) -> Stage[int]:
        """`add` with its store on a thread of its own (as the SQLite writer thread), not the loop."""
        def store(total: int) -> int:
            gate.wait(5)
            if value < 0:
                raise ValueError("negative")
            return total + value

        self.log.append(f"start {value}")
        try:
            self.total = yield pool.submit(store, self.total)
        except ValueError as exc:
            self.log.append(f"failed {value}")
            raise Conflict(str(exc)) from exc
        self.log.append(f"end {value}")
        return self.total

    def peek(self) -> tuple[int, bool]:  # not staged: answers at once
        return self.total, self.busy()


@pytest.fixture
async def counter() -> AsyncIterator[tuple[Any, asyncio.Event]]:
    gate = asyncio.Event()
    ref = Counter.start(asyncio.get_running_loop(), gate)
    yield ref.proxy(), gate
    if ref.is_alive():
        ref.stop(block=False)


async def test_a_staged_request_leaves_the_actor_free_and_the_next_waits_its_turn(
        counter: tuple[Any, asyncio.Event]) -> None:
    proxy, gate = counter
    first, second = asyncio.ensure_future(call(proxy.add(1), 5)), asyncio.ensure_future(call(proxy.add(10), 5))
    await asyncio.sleep(0.1)
    # The first request waits on the loop; the actor's thread answers other messages meanwhile.
    assert await call(proxy.peek(), 1) == (0, True)
    assert await call(proxy.log, 1) == ["start 1"] and not first.done() and not second.done()
    gate.set()
    assert await first == 1 and await second == 11  # one after the other: each saw the one before
    assert await call(proxy.log, 1) == ["start 1", "end 1", "start 10", "end 10"]
    assert await call(proxy.peek(), 1) == (11, False)
    assert len(await call(proxy.threads, 1)) == 1  # the actor's own thread, never the loop's


async def test_a_stage_error_is_raised_in_the_handler_and_later_answers_follow(
        counter: tuple[Any, asyncio.Event]) -> None:
    proxy, _ = counter
    assert await call(proxy.fail_then_recover(), 5) == "recovered"
    waiting = asyncio.ensure_future(call(proxy.later(), 5))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # answered by a later request, not by its own handler
    assert await call(proxy.resolve("done"), 5) is None
    assert await waiting == "done"
    # Off the loop (another actor's thread) the same answer is a plain blocking get.
    off_loop = await asyncio.to_thread(lambda: proxy.fail_then_recover().get(timeout=5))
    assert off_loop == "recovered"


async def test_requests_pending_when_the_actor_stops_are_answered_unavailable(
        counter: tuple[Any, asyncio.Event]) -> None:
    proxy, _ = counter
    first, second = asyncio.ensure_future(call(proxy.add(1), 5)), asyncio.ensure_future(call(proxy.add(2), 5))
    await asyncio.sleep(0.1)
    proxy.actor_ref.stop(block=False)
    for pending in (first, second):
        with pytest.raises(Unavailable):
            await asyncio.wait_for(pending, 2)  # at once, not at the caller's timeout


async def test_a_stage_on_a_thread_of_its_own_answers_through_the_actor_without_the_loop(
        counter: tuple[Any, asyncio.Event]) -> None:
    proxy, _ = counter
    gate = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = asyncio.ensure_future(call(proxy.add_in_thread(pool, gate, 1), 5))
        second = asyncio.ensure_future(call(proxy.add_in_thread(pool, gate, 10), 5))
        failing = asyncio.ensure_future(call(proxy.add_in_thread(pool, gate, -1), 5))
        await asyncio.sleep(0.1)
        # The first waits on its thread; the actor answers meanwhile and the others wait their turn.
        assert await call(proxy.peek(), 1) == (0, True)
        assert await call(proxy.log, 1) == ["start 1"]
        gate.set()
        assert await first == 1 and await second == 11
        with pytest.raises(Conflict):  # the thread's error is raised in the handler, which decides
            await failing
    assert await call(proxy.log, 1) == ["start 1", "end 1", "start 10", "end 10", "start -1", "failed -1"]
    assert await call(proxy.peek(), 1) == (11, False)
