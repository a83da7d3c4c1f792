"""`TurnStream`: a turn's frames handed from the task that drives it to the one that writes them.

Hand-over is in lock step: `send` returns once the reader asks for the next frame, that is once it
has written the previous one. So the SSE backpressure (one frame in flight, `SseSink`) still reaches
the driver, as it did when the driver wrote to the socket itself. A reader that goes away calls
`detach()`: from then on `send` returns at once and the driver only stores what comes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from ashd.backends._protocol import Frame


class TurnStream:
    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._wake = asyncio.Event()  # a frame or the end is there for the reader
        self._taken: asyncio.Future[None] | None = None  # resolved when the reader wants the next frame
        self._ended = False
        self._error: BaseException | None = None
        self.detached = False

    # --- driver side ---------------------------------------------------------------------------
    async def send(self, event: str, data: str, event_id: int | None = None) -> bool:
        """Hand one frame to the reader; True while a reader is there (the driver goes on either way)."""
        if self.detached:
            return False
        self._frames.append(Frame(event, data, event_id))
        self._wake.set()
        self._taken = asyncio.get_running_loop().create_future()
        await self._taken
        return not self.detached

    def end(self, error: BaseException | None = None) -> None:
        """No more frames; `error` (a failure of the driver itself) is raised to the reader."""
        self._ended = True
        self._error = error
        self._wake.set()

    # --- reader side ---------------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Frame]:
        return self

    async def __anext__(self) -> Frame:
        self._release()  # the previous frame is written: the driver may go on
        while not self._frames:
            if self.detached:
                raise StopAsyncIteration
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._frames.popleft()

    def detach(self) -> None:
        self.detached = True
        self._frames.clear()
        self._release()
        self._wake.set()

    def _release(self) -> None:
        taken, self._taken = self._taken, None
        if taken is not None and not taken.done():
            taken.set_result(None)
