"""The asyncio↔pykka bridge: replies arrive without blocking the loop; timeouts and errors map."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pykka
import pytest

from ashd.actors._aio import AioActor, AioFuture, call
from ashd.errors import Unavailable


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
    await asyncio.sleep(0.05)
    gate.set()
    assert await call(future, 5) == 42
    await task
    assert ticks > 5  # the loop ran while the actor was busy


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


def test_off_loop_futures_are_plain(gate: threading.Event) -> None:
    gate.set()
    proxy = Slow.start(gate).proxy()
    future = proxy.work(2)
    assert future.get(timeout=5) == 4
