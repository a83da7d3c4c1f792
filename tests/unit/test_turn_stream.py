"""TurnStream: a turn's frames from its driver task to its reader, in lock step."""

from __future__ import annotations

import asyncio

import pytest

from ashd.backends import Frame
from ashd.backends._stream import TurnStream


async def test_frames_arrive_in_order_and_the_driver_waits_for_the_reader() -> None:
    stream = TurnStream()
    sent: list[int] = []

    async def drive() -> None:
        for i in range(3):
            await stream.send("message", str(i), i)
            sent.append(i)
        stream.end()

    driver = asyncio.create_task(drive())
    first = await anext(aiter(stream))
    assert first == Frame("message", "0", 0)
    # The reader has not asked for the next frame: the driver may not run ahead of it.
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent == []
    rest = [frame async for frame in stream]
    await driver
    assert [f.data for f in rest] == ["1", "2"]
    assert sent == [0, 1, 2]


async def test_a_detached_reader_no_longer_holds_the_driver() -> None:
    stream = TurnStream()
    driver = asyncio.create_task(stream.send("message", "a", 1))
    assert (await anext(aiter(stream))).data == "a"
    stream.detach()
    assert await driver is False  # released, and told nobody reads any more
    assert await stream.send("done", "{}", 2) is False  # returns at once: the turn is only stored now
    assert [frame async for frame in stream] == []


async def test_a_failed_driver_raises_to_the_reader() -> None:
    stream = TurnStream()
    stream.end(RuntimeError("driver broke"))
    with pytest.raises(RuntimeError, match="driver broke"):
        await anext(aiter(stream))
