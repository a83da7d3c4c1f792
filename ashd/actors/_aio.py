"""The one bridge between asyncio and pykka actors: every crossing of the loop/thread line is here.

Loop → actor: `call()` awaits an actor's reply with a timeout, never blocking the loop. pykka's own
`await future` calls the blocking `get()` on the event loop (notes/measured.md Q1), so nothing
awaits a raw pykka future. Actors that the loop talks to derive from `AioActor`; their futures,
when created on a thread that runs an event loop, also resolve an asyncio future through
`call_soon_threadsafe`. From actor threads (no running loop) they behave like ThreadingFuture.
`stop_actor()` stops an actor and waits for it off the loop.

Actor → loop: `tell_loop()` runs a plain callable on the loop, `spawn_on_loop()` starts a
coroutine there that nobody waits for, and `pipe_to_actor()` starts one and tells an actor its
outcome as a message (Akka's `pipeTo`): the session actor's database and bridge work. No actor
thread ever waits for the loop; an actor that needs a result handles other messages until the
message with the result arrives (`_staged.py`).

Answering later: pykka replies with what a handler returns. A handler that returns a `Later`
answers when the `Later` is resolved: the caller's `AioFuture` takes its value then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pykka
from pykka import ThreadingActor, ThreadingFuture
from pykka.messages import ProxyCall

from ashd.errors import Unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)


class ActorGone(Unavailable):
    """The actor asked had stopped: the request was not handled (pykka fails each message still in
    a stopping actor's inbox, and every ask after). Asking a new actor for the same thing is safe."""


class Later(concurrent.futures.Future[T]):
    """An actor's answer given after its handler returned: the caller's future resolves with it.

    Resolved in the actor's own thread (`set_result`/`set_exception`), never cancelled.
    """


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
        if isinstance(value, Later):  # the handler answers later: take its value when it has one
            value.add_done_callback(self._settle)
            return
        super().set(value)
        self._resolve(value, None)

    def _settle(self, later: concurrent.futures.Future[Any]) -> None:
        exc = Unavailable("the request was abandoned; try again") if later.cancelled() else later.exception()
        if exc is None:
            self.set(later.result())
        else:
            self.set_exception((type(exc), exc, exc.__traceback__))

    def set_exception(self, exc_info: Any = None) -> None:
        super().set_exception(exc_info)
        result = self._result
        exc = result.exc_info[1] if result is not None and result.exc_info is not None else None
        self._resolve(None, exc or RuntimeError("actor failed"))


class Asker:
    """Calls on an actor's methods, each an ask (a future, as through `ref.proxy()`): pykka builds a
    proxy by introspecting every attribute of the actor, 0.3 ms of the loop's time for a session
    actor, which each new session paid on its create. Methods only: no attributes, no nesting."""

    __slots__ = ("_ref",)

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self._ref = ref

    def __getattr__(self, name: str) -> Callable[..., pykka.Future[Any]]:
        ref = self._ref

        def ask(*args: Any, **kwargs: Any) -> pykka.Future[Any]:
            return ref.ask(ProxyCall(attr_path=(name,), args=args, kwargs=kwargs), block=False)

        return ask


class AioActor(ThreadingActor):
    """Base for actors that are asked from the event loop."""

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return AioFuture()


async def call(future: pykka.Future[T] | concurrent.futures.Future[T], timeout: float) -> T:
    """Await an actor reply without blocking the loop, bounded by `timeout` seconds. A
    `concurrent.futures.Future` is the answer of a request handled on this thread (`_inline.py`):
    taken at once when it is resolved already, as it mostly is."""
    aio = getattr(future, "aio", None)
    try:
        if isinstance(future, concurrent.futures.Future):
            if future.done():
                return future.result()
            async with asyncio.timeout(timeout):  # shielded: a timeout must not cancel the actor's `Later`
                return await asyncio.shield(asyncio.wrap_future(future))
        if aio is None:
            # A future from a non-Aio actor or created off-loop: wait for it in a thread, which gives
            # up a moment after this call does (a future never resolved would keep one of the loop's
            # few executor threads for ever, and with enough of them every `to_thread` of the process).
            loop = asyncio.get_running_loop()
            waiting = loop.run_in_executor(None, functools.partial(future.get, timeout=timeout + 1))
            return await asyncio.wait_for(waiting, timeout)
        # No shield: the asyncio future is this call's alone, and one cancelled (a timeout) is skipped
        # when the actor answers after all (`AioFuture._resolve`).
        async with asyncio.timeout(timeout):
            return await aio  # type: ignore[no-any-return]
    except TimeoutError as exc:
        raise Unavailable("an internal component did not answer in time; try again") from exc
    except pykka.ActorDeadError as exc:
        raise ActorGone("the service is shutting down or a component stopped; try again") from exc


def forget(future: pykka.Future[Any], what: str) -> None:
    """An ask nobody awaits (a tell that keeps pykka's rule: a failing tell stops the actor): its
    outcome is taken, so that asyncio does not log a failure as never retrieved. An actor that had
    stopped has nothing left to do it for; any other failure is logged, as `what` it was doing."""
    aio = getattr(future, "aio", None)
    if aio is None:
        return

    def taken(fut: asyncio.Future[Any]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if exc is not None and not isinstance(exc, pykka.ActorDeadError):
            log.warning("%s failed: %s", what, exc)

    aio.add_done_callback(taken)


async def stop_actor(ref: pykka.ActorRef[Any], timeout: float) -> None:
    """Stop an actor and wait until it has stopped, in a worker thread (pykka's stop blocks)."""
    await asyncio.to_thread(lambda: ref.stop(block=True, timeout=timeout))


# --- from an actor thread to the loop ------------------------------------------------------------
def tell_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """Run `fn(*args)` on the loop soon; nothing waits for it. Dropped once the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def spawn_on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                  what: str) -> concurrent.futures.Future[Any] | None:
    """Start `coro` on the loop; the caller need not wait for it, its failure is logged (`what` it
    was doing). Its future, or None when the loop is closed and it never started."""
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: shutting down, the work has no one to serve
        coro.close()
        return None

    def done(fut: concurrent.futures.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("%s failed: %s", what, fut.exception())

    future.add_done_callback(done)
    return future


_piped: set[concurrent.futures.Future[None]] = set()  # work piped to actors, held until it is done


def pipe_to_actor(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], timeout: float | None,
                  ref: pykka.ActorRef[Any], message: Callable[[Any, BaseException | None], Any],
                  here: Callable[[Any], bool] | None = None) -> None:
    """Run `coro` on the loop, at most `timeout` seconds (None: no bound of its own), then tell `ref`
    `message(result, error)`.

    Called from the actor's thread, which goes on with its inbox meanwhile; the outcome comes back
    as an ordinary message. A loop that is closed or cancels the work (shutting down) is reported as
    Unavailable; an actor stopped meanwhile gets nothing (the outcome has no one left to serve).
    `here(result)`, called on the loop with a result, may take it there instead: True when it did.
    """
    async def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            async with asyncio.timeout(timeout):
                result = await coro
        except asyncio.CancelledError:
            _tell(ref, message(None, Unavailable("the service is shutting down; try again")))
            raise
        except Exception as exc:  # noqa: BLE001 - the actor's handler decides what an error means
            error = exc
        if error is None and here is not None and here(result):
            return
        _tell(ref, message(result, error))

    runner = run()
    try:
        future = asyncio.run_coroutine_threadsafe(runner, loop)
    except RuntimeError:  # the loop is closed: shutting down
        runner.close()
        coro.close()
        _tell(ref, message(None, Unavailable("the service is shutting down; try again")))
        return
    _piped.add(future)
    future.add_done_callback(_piped.discard)


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)
