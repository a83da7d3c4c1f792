"""The one bridge between asyncio and pykka actors: every crossing of the loop/thread line is here.

Loop → actor: `call()` awaits an actor's reply with a timeout, never blocking the loop. pykka's own
`await future` calls the blocking `get()` on the event loop (notes/measured.md Q1), so nothing
awaits a raw pykka future. Actors that the loop talks to derive from `AioActor`; their futures,
when created on a thread that runs an event loop, also resolve an asyncio future through
`call_soon_threadsafe`. From actor threads (no running loop) they behave like ThreadingFuture.
`stop_actor()` stops an actor and waits for it off the loop.

Actor → loop: `tell_loop()` runs a plain callable on the loop, `spawn_on_loop()` starts a
coroutine there that nobody waits for, and `run_on_loop()` runs one and waits for its result in
the actor's thread: the session actor's database and bridge work. That one blocks the actor (never
the loop): the actor's inbox serialises the session's transitions, so it has nothing else to do
meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pykka
from pykka import ThreadingActor, ThreadingFuture

from ashd.errors import Unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)


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


async def stop_actor(ref: pykka.ActorRef[Any], timeout: float) -> None:
    """Stop an actor and wait until it has stopped, in a worker thread (pykka's stop blocks)."""
    await asyncio.to_thread(lambda: ref.stop(block=True, timeout=timeout))


# --- from an actor thread to the loop ------------------------------------------------------------
def tell_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """Run `fn(*args)` on the loop soon; nothing waits for it. Dropped once the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def spawn_on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], what: str) -> None:
    """Start `coro` on the loop; nothing waits for it, its failure is logged (`what` it was doing)."""
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: shutting down, the work has no one to serve
        coro.close()
        return

    def done(fut: concurrent.futures.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("%s failed: %s", what, fut.exception())

    future.add_done_callback(done)


def run_on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run `coro` on the loop and wait for its result in this (actor) thread, at most `timeout` s.

    Never call this on the loop's own thread: it would wait for itself.
    """
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
