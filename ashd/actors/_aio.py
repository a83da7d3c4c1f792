"""The one bridge between asyncio and pykka actors.

pykka's own `await future` calls the blocking `get()` on the event loop (notes/measured.md Q1), so
the HTTP side never awaits a raw pykka future. Actors that the loop talks to derive from
`AioActor`; their futures, when created on a thread that runs an event loop, also resolve an
asyncio future through `call_soon_threadsafe`. `call()` awaits that with a timeout.
From actor threads (no running loop) the futures behave exactly like ThreadingFuture.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeVar

import pykka
from pykka import ThreadingActor, ThreadingFuture

from ashd.errors import Unavailable

T = TypeVar("T")


class AioFuture(ThreadingFuture[Any]):
    def __init__(self) -> None:
        super().__init__()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self.aio: asyncio.Future[Any] | None = self._loop.create_future() if self._loop else None

    def _resolve(self, value: Any, exc: BaseException | None) -> None:
        if self._loop is None or self.aio is None:
            return

        def apply(fut: asyncio.Future[Any] = self.aio) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

        # The loop may already be closed at shutdown; the ThreadingFuture side still holds the value.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(apply)

    def set(self, value: Any | None = None) -> None:
        super().set(value)
        self._resolve(value, None)

    def set_exception(self, exc_info: Any = None) -> None:
        super().set_exception(exc_info)
        result = self._result
        exc = result.exc_info[1] if result is not None and result.exc_info is not None else None
        self._resolve(None, exc or RuntimeError("actor failed"))


class AioActor(ThreadingActor):
    """Base for actors that are asked from the event loop."""

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return AioFuture()


async def call(future: pykka.Future[T], timeout: float) -> T:
    """Await an actor reply without blocking the loop, bounded by `timeout` seconds."""
    aio = getattr(future, "aio", None)
    try:
        if aio is None:
            # A future from a non-Aio actor or created off-loop: wait for it in a thread.
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(loop.run_in_executor(None, future.get), timeout)
        async with asyncio.timeout(timeout):
            return await asyncio.shield(aio)  # type: ignore[no-any-return]
    except TimeoutError as exc:
        raise Unavailable("an internal component did not answer in time; try again") from exc
    except pykka.ActorDeadError as exc:
        raise Unavailable("the service is shutting down or a component stopped; try again") from exc
