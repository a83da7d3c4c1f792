"""A request handled on the caller's thread while its actor is idle: in order, by one owner at a time.

A crossing from the loop to an actor's thread and back costs 0.1-0.4 ms on two vCPUs, and the work
done on the thread just woken runs about three times slower than on a warm one: a pause's
transaction takes 0.41 ms there against 0.12 in a loop (docs/performance.md, tenth pass). When the
actor has nothing to do (its inbox empty, every message put there handled, no staged request
running or stashed), the caller may run the request's handler itself, holding the actor's **turn**:
a lock the actor's own thread holds for each message it handles. A message that arrives meanwhile
waits for the turn, so it is handled after this request, as it would have been had the request
gone through the inbox before it. The actor's state still has one owner at any moment, and its
requests one order.

Only what the actor declares safe runs this way (`StagedActor._inline_ok`): requests whose steps
on the caller's thread neither block nor wait for another actor. Loop work they yield is piped as
usual, and its outcome goes on on the loop under the same conditions (the actor still idle), else
to the actor's thread; `ON_ACTOR_THREAD` moves the rest of a handler there (a path that turns out
to need the pool, say). A handler already running on the actor's
thread may also go on on the loop after a stage's loop work, under the same turn and the same
conditions (`_staged.OnLoop.then_here`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pykka

from ashd.actors._aio import AioActor, Later

T = TypeVar("T")


class TurnInbox(queue.Queue[Any]):
    """An actor's inbox that counts what was put in it, with the actor's turn beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = threading.Lock()
        self.puts = 0  # under the queue's own lock, as the item becomes visible
        self.handled = 0  # under `turn`, by the actor's thread
        self.owner: weakref.ref[Any] | None = None
        # Called after each put while set: the actor's thread is started by its first message
        # (`StagedActor.lazy_thread`).
        self.on_put: Callable[[], None] | None = None

        # Set once the actor has stopped and its inbox was emptied (`close`): what is put from then
        # on is refused at once (`_refuse`), never left waiting in an inbox nobody reads.
        self.closed = False
        self._refused: list[Any] = []

    def _put(self, item: Any) -> None:
        if self.closed:  # under the queue's lock, as `close` sets it
            self._refused.append(item)
            return
        self.puts += 1
        super()._put(item)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if self.closed:
            _refuse(item)
            return
        super().put(item, block, timeout)
        if self.closed:  # closed while this put waited for the lock: it was refused, not queued
            with self.mutex:
                refused, self._refused = self._refused, []
            for late in refused:
                _refuse(late)
            return
        on_put = self.on_put
        if on_put is not None:
            on_put()

    def close(self) -> None:
        """The actor has stopped: what its inbox holds, and whatever is put from now on, is refused
        with ActorDeadError. pykka's `ask` checks that the actor is alive and then puts: a put
        between the two that came after the actor's last look at its inbox was never answered, and
        its caller waited out its whole timeout (minutes for a resume or a turn on a runner, where
        an actor retires on its own thread while the loop asks it)."""
        with self.mutex:
            self.closed = True
            left = list(self.queue)
            self.queue.clear()
        for item in left:
            _refuse(item)


def _refuse(envelope: Any) -> None:
    reply_to = getattr(envelope, "reply_to", None)
    if reply_to is None:
        return  # a tell: nobody waits for it
    if isinstance(envelope.message, pykka.messages._ActorStop):  # a stop of a stopped actor: done
        reply_to.set(None)
        return
    dead = pykka.ActorDeadError("the actor stopped before it handled the message")
    reply_to.set_exception(exc_info=(pykka.ActorDeadError, dead, None))


class TurnTakingActor(AioActor):
    """An actor whose inbox is a `TurnInbox` and that handles each message holding its turn: what
    `try_inline` and `call_inline` need to run a request of it on another thread meanwhile."""

    # True: the actor's thread is started by its first message, not by `start` (`StagedActor`).
    lazy_thread = False

    def __init__(self) -> None:
        super().__init__()
        inbox = self.actor_inbox
        assert isinstance(inbox, TurnInbox)
        inbox.owner = weakref.ref(self)

    @staticmethod
    def _create_actor_inbox() -> TurnInbox:
        return TurnInbox()

    def _actor_loop_teardown(self) -> None:
        super()._actor_loop_teardown()
        inbox = self.actor_inbox
        assert isinstance(inbox, TurnInbox)
        inbox.close()

    def _handle_receive(self, message: Any) -> Any:
        # Each message is handled holding the actor's turn, which a request handled on its caller's
        # thread holds too: one of them at a time, each in the order it came.
        inbox = self.actor_inbox
        assert isinstance(inbox, TurnInbox)
        with inbox.turn:
            try:
                return super()._handle_receive(message)
            finally:
                inbox.handled += 1


def call_inline(ref: pykka.ActorRef[Any], fn: Callable[[Any], T]) -> tuple[bool, T | None]:
    """`fn(actor)` on this thread if the actor (a `TurnTakingActor`) is idle and ready: (True, its
    result). (False, None): ask the actor as usual. `fn` must neither block nor ask another actor,
    and touch only what the actor's own messages touch."""
    with _idle_owner(ref) as actor:
        return (False, None) if actor is None else (True, fn(actor))


@contextlib.contextmanager
def _idle_owner(ref: pykka.ActorRef[Any]) -> Iterator[Any | None]:
    """The actor behind `ref`, its turn held, when it is idle and its thread has started (its
    `on_start` ran before its first message: `handled` > 0) or waits for its first message (a
    `lazy_thread` actor has no `on_start` to wait for); else None."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, TurnInbox) or inbox.owner is None or (actor := inbox.owner()) is None:
        yield None
        return
    with idle_turn(inbox, ref.actor_stopped) as idle:
        yield actor if idle and (inbox.handled > 0 or actor.lazy_thread) else None


@contextlib.contextmanager
def idle_turn(inbox: TurnInbox, stopped: threading.Event) -> Iterator[bool]:
    """Hold the actor's turn if it is free: True inside when, besides, every message put in its
    inbox has been handled and the actor has not stopped (the caller checks its own requests)."""
    if not inbox.turn.acquire(blocking=False):
        yield False
        return
    try:
        yield inbox.puts == inbox.handled and not stopped.is_set()
    finally:
        inbox.turn.release()


def try_inline(ref: pykka.ActorRef[Any], name: str, *args: Any, **kwargs: Any) -> Later[Any] | None:
    """Handle the staged request `name` on this thread if the actor is idle and declares it safe:
    its answer (a `Later`, usually resolved already). None: ask the actor as usual."""
    with _idle_owner(ref) as actor:
        reply: Later[Any] | None = None if actor is None else actor.run_inline(name, *args, **kwargs)
        return reply
