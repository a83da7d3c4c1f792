"""Staged handlers: an actor that handles one request at a time and never waits for the event loop.

A request handler is a generator method decorated with `@staged`. Where it needs work done on the
loop (a database call, a bridge request) it yields the coroutine, or `OnLoop(coro, timeout)`, and
the result comes back as the value of the `yield` (an exception is raised there). A
`concurrent.futures.Future` may be yielded too: work already running on a thread of its own (a
SQLite write on the writer thread), whose outcome is told to the actor from that thread (a handler
running on the loop, `_inline.py`, awaits it there instead); one already resolved (a short SQLite
transaction the actor's thread ran itself) is taken at once. Between those
stages the actor's thread is free: the work is piped to the loop (`_aio.pipe_to_actor`), its
outcome returns as a message, and requests that arrive meanwhile wait in arrival order (stashed)
until the running one has answered. So the requests of one actor stay serialised, each with one
answer, while its thread never blocks on the loop and the loop never waits for it.

A staged method returns a `Later`; through a proxy the caller's future resolves with the handler's
return value (or its exception). A handler may itself return a `Later` that another request
resolves (a pause that waits for the running turn's end). Methods that are not staged answer at
once from the state the last finished request left (reads of memory only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import pykka
from pykka import ActorRegistry

from ashd.actors._aio import ActorGone, Later, pipe_to_actor
from ashd.actors._inline import TurnInbox, TurnTakingActor, idle_turn
from ashd.errors import Unavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
A = TypeVar("A", bound="StagedActor")

# What a staged handler is: it yields loop work and gets each result back; returns the answer.
Stage = Generator[Any, Any, T]


@dataclass(frozen=True)
class OnLoop:
    """Loop work with its own time limit (a bare coroutine gets the actor's `stage_timeout`).

    `then_here`: when the work succeeds and the actor is idle then (`_inline.py`), the handler goes on
    on the loop's thread, holding the actor's turn, instead of on the actor's: two crossings fewer
    for a handler whose next steps neither block nor ask another actor (a create's transition after
    the bridge's `init`). Otherwise, or on an error, the outcome goes to the actor's thread as usual.
    A bare coroutine yielded by a handler already running on the loop is taken as `then_here`.
    """

    coro: Coroutine[Any, Any, Any]
    timeout: float
    then_here: bool = False


class _OnActorThread:
    """Yielded by a handler: go on on the actor's own thread (the handler may be running on the
    caller's, `_inline.py`, and what follows may block: an ask of the pool, a sandbox's start)."""

    def __repr__(self) -> str:
        return "ON_ACTOR_THREAD"


ON_ACTOR_THREAD = _OnActorThread()


class _TakeNext:
    """Told to the actor: a request finished on the loop's thread (`OnLoop.then_here`) with others
    waiting, which its own thread takes, as what they do may block."""


_TAKE_NEXT = _TakeNext()


class _Retire:
    """Told to the actor: stop once the requests it has are answered (`retire_soon`)."""

    def __repr__(self) -> str:
        return "RETIRE"


_RETIRE = _Retire()


@dataclass(frozen=True)
class _StageDone:
    """The loop's outcome of one stage, told to the actor."""

    stage: int
    result: Any
    error: BaseException | None


@dataclass
class _Request:
    name: str
    steps: Stage[Any]
    reply: Later[Any]


def staged(handler: Callable[Concatenate[A, P], Stage[T]]) -> Callable[Concatenate[A, P], Later[T]]:
    """Make a generator method a request: run now if the actor is idle, else after those before it."""

    def request(self: A, /, *args: P.args, **kwargs: P.kwargs) -> Later[T]:
        return self._accept(_Request(handler.__name__, handler(self, *args, **kwargs), Later()))

    functools.update_wrapper(request, handler)
    return request


class StagedActor(TurnTakingActor):
    # `lazy_thread`: `start` registers the actor without its thread, which its first message starts. A
    # request handled on its caller's thread meanwhile (`_inline.py`) needs none: a session that is
    # created, paused and resumed on the loop never starts one. Only for an actor with no `on_start`.

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Any]:
        if not cls.lazy_thread:
            return super().start(*args, **kwargs)
        obj = cls(*args, **kwargs)
        ActorRegistry.register(obj.actor_ref)
        inbox = obj.actor_inbox
        assert isinstance(inbox, TurnInbox)
        inbox.on_put = obj._start_thread
        return obj.actor_ref

    def _start_thread(self) -> None:
        """The actor's thread, started by the first message put in its inbox, from the thread that
        put it (the loop's, the writer's, the pool's): once."""
        with self._thread_lock:
            inbox = self.actor_inbox
            assert isinstance(inbox, TurnInbox)
            if inbox.on_put is None:
                return
            on_put, inbox.on_put = inbox.on_put, None
            try:
                self._start_actor_loop()
            except BaseException:  # no thread (a host out of them): the next message tries again
                inbox.on_put = on_put
                raise

    def _stop_unstarted(self) -> bool:
        """Stop this actor here when its thread never started and it has nothing to do: True when it
        did. A thread started only to handle the stop message would cost the caller its start."""
        inbox = self.actor_inbox
        assert isinstance(inbox, TurnInbox)
        with self._thread_lock:
            if inbox.on_put is None:
                return False
            with idle_turn(inbox, self.actor_stopped) as idle:
                if not idle or self.busy():
                    return False
                inbox.on_put = None  # never started: a message from now on finds it stopped
                self._stop()
                inbox.close()  # one put by an ask that saw it alive just before is refused, not kept
        return True

    def __init__(self, loop: Any, stage_timeout: float) -> None:
        super().__init__()
        self._loop = loop
        self.stage_timeout = stage_timeout
        self._running: _Request | None = None
        self._stashed: deque[_Request] = deque()
        self._stage = 0  # number of the stage now on the loop; a stale outcome is ignored
        self._inline = False  # a handler runs on the caller's thread now (`_inline.try_inline`)
        self._thread_lock = threading.Lock()
        # Stop once idle (`retire_soon`, `retire_when_idle`): what came before the stop is answered,
        # what comes after finds the actor stopped, unhandled (`ActorGone`: asked again elsewhere).
        self._retiring = False

    def run_inline(self, name: str, *args: Any, **kwargs: Any) -> Later[Any] | None:
        """The staged request `name` handled on the caller's thread, which holds this actor's turn
        and found its inbox idle (`_inline.try_inline`); None when this actor has a request of its own
        or does not let `name` run there."""
        if self.busy() or not self._inline_ok(name):
            return None
        self._inline = True
        try:
            reply: Later[Any] = getattr(self, name)(*args, **kwargs)
        finally:
            self._inline = False
        return reply

    def _inline_ok(self, name: str) -> bool:
        """Whether the staged request `name` may run on its caller's thread while this actor is idle
        (`_inline.py`): only a request whose steps there neither block nor ask another actor."""
        return False

    def busy(self) -> bool:
        """A request is being handled or waiting to be."""
        return self._running is not None or bool(self._stashed)

    def waiting(self) -> int:
        """How many requests wait for the one running."""
        return len(self._stashed)

    def _accept(self, request: _Request) -> Later[Any]:
        self._stashed.append(request)
        self._next()
        return request.reply

    def retire_when_idle(self) -> None:
        """From a handler: this actor stops once it has answered its requests (`retire_soon`)."""
        self._retiring = True

    def _next(self) -> None:
        while self._running is None and self._stashed:
            self._running = self._stashed.popleft()
            self._advance(None, None)  # finishes at once when the handler yields nothing
        if self._retiring and not self.busy() and not self.actor_stopped.is_set():
            if self._inline:  # stopped from its own thread, whose loop then ends
                with contextlib.suppress(pykka.ActorDeadError):
                    self.actor_ref.tell(_TAKE_NEXT)
            else:
                self._stop()

    def _advance(self, result: Any, error: BaseException | None) -> None:
        request = self._running
        assert request is not None
        while True:
            try:
                work = request.steps.throw(error) if error is not None else request.steps.send(result)
            except StopIteration as done:
                self._running = None
                _answer(request.reply, done.value)
                return
            except Exception as exc:  # noqa: BLE001 - the request's answer is its error
                self._running = None
                request.reply.set_exception(exc)
                return
            if work is ON_ACTOR_THREAD and not self._inline:
                result, error = None, None  # on it already
                continue
            if not (isinstance(work, concurrent.futures.Future) and work.done()):
                break
            # Work that already ran on this thread (a direct SQLite transaction): go on at once.
            error = work.exception()
            result = None if error is not None else work.result()
        self._stage += 1
        if work is ON_ACTOR_THREAD:  # the rest of the handler as a message to the actor's thread
            _tell_done(self.actor_ref, self._stage, _RESOLVED)
            return
        timeout: float | None
        if isinstance(work, concurrent.futures.Future):
            if not self._inline:
                # Work already started on a thread of its own (the SQLite writer): its outcome comes
                # back as a message straight from there, without a trip through the loop.
                work.add_done_callback(functools.partial(_tell_done, self.actor_ref, self._stage))
                return
            # A handler on the loop awaits it there and goes on there (below), as after loop work:
            # no trip to the actor's thread, which may not even be started (`lazy_thread`). Bounded
            # by the work itself, as on the actor's thread.
            coro, timeout = _outcome(work), None
        elif isinstance(work, OnLoop):
            coro, timeout = work.coro, work.timeout
        else:
            coro, timeout = work, self.stage_timeout
        # A handler running on the loop (`_inline.py`) goes on there after its loop work, as it would
        # have had that work been done there at once (a transaction on PostgreSQL is awaited where one
        # on SQLite runs in place): the same steps on the same thread, two crossings fewer.
        then_here = work.then_here if isinstance(work, OnLoop) else self._inline
        here = functools.partial(self._go_on_here, self._stage) if then_here else None
        pipe_to_actor(self._loop, coro, timeout, self.actor_ref, functools.partial(_StageDone, self._stage), here)

    def _go_on_here(self, stage: int, result: Any) -> bool:
        """On the loop, with a stage's result (`OnLoop.then_here`): go on with the handler here if this
        actor is idle, holding its turn as `_inline.try_inline` does. False: tell the actor instead."""
        inbox = self.actor_inbox
        assert isinstance(inbox, TurnInbox)
        with idle_turn(inbox, self.actor_stopped) as idle:
            if not idle or self._running is None or stage != self._stage:
                return False
            self._inline = True
            try:
                self._advance(result, None)
            finally:
                self._inline = False
            if self._running is None and (self._stashed or self._retiring):
                with contextlib.suppress(pykka.ActorDeadError):
                    self.actor_ref.tell(_TAKE_NEXT)
            return True

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _StageDone):
            if self._running is not None and message.stage == self._stage:
                self._advance(message.result, message.error)
                self._next()
            return None
        if message is _TAKE_NEXT:
            self._next()
            return None
        if message is _RETIRE:
            self._retiring = True
            self._next()
            return None
        return super().on_receive(message)

    def on_stop(self) -> None:
        self._abandon()

    def on_failure(self, *_exc_info: Any) -> None:
        self._abandon()

    def _abandon(self) -> None:
        """Stopped with requests unanswered: each gets an error now instead of its caller's timeout.
        The running handler is closed (GeneratorExit at its `yield`), so that it can let go of what
        it holds without waiting for anything."""
        running, self._running = self._running, None
        requests = ([running] if running is not None else []) + list(self._stashed)
        self._stashed = deque()
        if running is not None:
            try:
                running.steps.close()
            except Exception:  # stopping anyway: the handler's cleanup failed, say so
                log.exception("closing the request %s of a stopped actor failed", running.name)
        for request in requests:
            log.debug("request %s abandoned: the actor stopped", request.name)
            if not request.reply.done():
                # One stashed had not begun: asking a new actor for it is safe (`ActorGone`).
                gone = ActorGone if request is not running else Unavailable
                request.reply.set_exception(gone("the service is shutting down or a component stopped; try again"))


def retire_soon(ref: pykka.ActorRef[Any]) -> None:
    """Stop the actor once it has answered the requests it has now (`stop_soon` fails those with
    503s): here and now when it is a `lazy_thread` actor that never started and is idle."""
    inbox = ref.actor_inbox
    actor = inbox.owner() if isinstance(inbox, TurnInbox) and inbox.owner is not None else None
    if isinstance(actor, StagedActor) and actor._stop_unstarted():
        return
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(_RETIRE)


def stop_soon(ref: pykka.ActorRef[Any]) -> None:
    """Stop the actor without waiting: here and now when it is a `lazy_thread` actor whose thread
    never started and that is idle, else by pykka's stop message to its thread."""
    inbox = ref.actor_inbox
    actor = inbox.owner() if isinstance(inbox, TurnInbox) and inbox.owner is not None else None
    if isinstance(actor, StagedActor) and actor._stop_unstarted():
        return
    with contextlib.suppress(pykka.ActorDeadError):
        ref.stop(block=False)


async def _outcome(work: concurrent.futures.Future[Any]) -> Any:
    return await asyncio.wrap_future(work)


_RESOLVED: concurrent.futures.Future[None] = concurrent.futures.Future()
_RESOLVED.set_result(None)


def _tell_done(ref: Any, stage: int, work: concurrent.futures.Future[Any]) -> None:
    error = work.exception()
    with contextlib.suppress(pykka.ActorDeadError):  # stopped meanwhile: the outcome serves no one
        ref.tell(_StageDone(stage, None if error is not None else work.result(), error))


def _answer(reply: Later[Any], value: Any) -> None:
    if not isinstance(value, Later):
        reply.set_result(value)
        return

    def settle(later: concurrent.futures.Future[Any]) -> None:
        exc = later.exception()
        if exc is None:
            reply.set_result(later.result())
        else:
            reply.set_exception(exc)

    value.add_done_callback(settle)
