"""A staged request handled on the caller's thread while its actor is idle (`actors/_inline.py`):
only then, only what the actor lets run there, in the order the actor would have handled it, and
with the rest of a handler on the actor's thread when it asks for it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator
from typing import Any

import pykka
import pytest
from pykka._envelope import Envelope

from ashd.actors._aio import ActorGone, Later, call
from ashd.actors._inline import TurnTakingActor, call_inline, try_inline
from ashd.actors._staged import ON_ACTOR_THREAD, OnLoop, Stage, StagedActor, staged, stop_soon
from ashd.errors import BadRequest, Unavailable


class Recorder(StagedActor):
    """Records which thread ran each step of its requests, and in what order requests ran."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop, stage_timeout=5)
        self.log: list[tuple[str, int]] = []
        self.allowed = {"step", "hop", "wait_for", "fail", "tell_and_step"}

    def _inline_ok(self, name: str) -> bool:
        return name in self.allowed

    @staged
    def step(self, label: str) -> Stage[int]:
        yield from ()
        self.log.append((label, threading.get_ident()))
        return threading.get_ident()

    @staged
    def hop(self) -> Stage[tuple[int, int]]:
        before = threading.get_ident()
        yield ON_ACTOR_THREAD
        return before, threading.get_ident()

    @staged
    def wait_for(self, work: concurrent.futures.Future[int]) -> Stage[tuple[int, int]]:
        value = yield work
        return value, threading.get_ident()

    @staged
    def fail(self) -> Stage[None]:
        yield from ()
        raise BadRequest("refused here")

    @staged
    def tell_and_step(self, gate: threading.Event) -> Stage[None]:
        """Another thread sends this actor a message while this request runs on the caller's thread."""
        yield from ()
        self.log.append(("inline start", threading.get_ident()))
        def send() -> None:
            self.actor_ref.tell(_Step("told"))
            gate.set()

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(5)
        self.log.append(("inline end", threading.get_ident()))

    @staged
    def then_here(self, ready: asyncio.Event, fail: bool = False) -> Stage[tuple[str, int]]:
        """Loop work whose outcome the handler may take on the loop (`OnLoop.then_here`)."""
        async def work() -> str:
            await ready.wait()
            if fail:
                raise BadRequest("the loop's work failed")
            return "worked"

        try:
            outcome = yield OnLoop(work(), timeout=5, then_here=True)
        except BadRequest as exc:
            outcome = exc.message
        self.log.append(("then_here", threading.get_ident()))
        return outcome, threading.get_ident()

    def blocked(self, gate: threading.Event) -> None:  # not staged: holds the actor's thread
        gate.wait(5)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Step):
            self.log.append((message.label, threading.get_ident()))
            return None
        return super().on_receive(message)


class _Step:
    def __init__(self, label: str) -> None:
        self.label = label


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[pykka.ActorRef[Recorder], Any]]:
    ref = Recorder.start(asyncio.get_running_loop())
    proxy = ref.proxy()
    await call(proxy.step("first, through the inbox"), 5)  # the actor's thread has started
    yield ref, proxy
    pykka.ActorRegistry.stop_all()


async def test_an_idle_actor_lets_the_caller_handle_the_request(recorder: Any) -> None:
    ref, _ = recorder
    reply = try_inline(ref, "step", "inline")
    assert reply is not None and reply.done()
    assert reply.result() == threading.get_ident()  # the loop's own thread ran it
    assert await call(reply, 5) == threading.get_ident()


async def test_a_request_the_actor_does_not_allow_goes_through_its_inbox(recorder: Any) -> None:
    ref, proxy = recorder
    ref_actor = ref.actor_inbox.owner()
    ref_actor.allowed.discard("step")
    assert try_inline(ref, "step", "refused") is None
    assert await call(proxy.step("asked"), 5) != threading.get_ident()


async def test_an_actor_not_yet_started_or_busy_is_not_bypassed(recorder: Any) -> None:
    fresh = Recorder.start(asyncio.get_running_loop())  # nothing handled yet
    assert try_inline(fresh, "step", "too early") is None
    ref, proxy = recorder
    gate = threading.Event()
    busy = proxy.blocked(gate)  # the actor's thread holds a message
    await asyncio.sleep(0.05)
    queued = proxy.step("queued behind it")  # and one more waits in its inbox
    assert try_inline(ref, "step", "would jump the queue") is None
    gate.set()
    await call(busy, 5)
    await call(queued, 5)
    assert try_inline(ref, "step", "idle again") is not None
    labels = [label for label, _ in ref.actor_inbox.owner().log]
    assert labels[-2:] == ["queued behind it", "idle again"]


async def test_a_message_sent_meanwhile_is_handled_after_the_inline_request(recorder: Any) -> None:
    ref, _ = recorder
    gate = threading.Event()
    reply = try_inline(ref, "tell_and_step", gate)
    assert reply is not None and reply.done() and gate.is_set()
    actor = ref.actor_inbox.owner()
    for _ in range(100):
        if any(label == "told" for label, _ in actor.log):
            break
        await asyncio.sleep(0.01)
    labels = [label for label, _ in actor.log]
    assert labels[-3:] == ["inline start", "inline end", "told"]
    told_thread = next(thread for label, thread in actor.log if label == "told")
    assert told_thread != threading.get_ident()  # the actor's own thread handled the message


async def test_on_actor_thread_moves_the_rest_of_the_handler(recorder: Any) -> None:
    ref, proxy = recorder
    reply = try_inline(ref, "hop")
    assert reply is not None
    before, after = await call(reply, 5)
    assert before == threading.get_ident() and after != before
    before, after = await call(proxy.hop(), 5)  # through the inbox it is already there: no hop
    assert before == after != threading.get_ident()


async def test_pending_work_of_an_inline_request_is_awaited_on_the_loop(recorder: Any) -> None:
    """Work running on a thread of its own (a write that waited for the SQLite writer) is awaited on
    the loop, and the handler goes on there while the actor is idle; else on the actor's thread."""
    ref, proxy = recorder
    work: concurrent.futures.Future[int] = concurrent.futures.Future()
    reply = try_inline(ref, "wait_for", work)
    assert reply is not None and not reply.done()
    assert try_inline(ref, "step", "while it waits") is None  # the actor has a request running
    with pytest.raises(Unavailable):
        await call(reply, 0.05)  # the caller gives up ...
    threading.Timer(0.02, work.set_result, (7,)).start()  # resolved on another thread
    value, thread = await asyncio.wrap_future(reply)  # ... the request is not cancelled: it answers
    assert value == 7 and thread == threading.get_ident()

    work = concurrent.futures.Future()
    reply = try_inline(ref, "wait_for", work)
    assert reply is not None
    gate = threading.Event()
    busy = proxy.blocked(gate)  # the actor's thread holds its turn when the work is done
    await asyncio.sleep(0.05)
    work.set_result(8)
    await asyncio.sleep(0.05)
    gate.set()
    await call(busy, 5)
    value, thread = await call(reply, 5)
    assert value == 8 and thread != threading.get_ident()


async def test_an_inline_request_answers_its_error(recorder: Any) -> None:
    ref, _ = recorder
    reply = try_inline(ref, "fail")
    assert isinstance(reply, Later)
    with pytest.raises(BadRequest, match="refused here"):
        await call(reply, 5)
    assert try_inline(ref, "step", "after the error") is not None


async def test_a_stopped_actor_is_not_run_inline(recorder: Any) -> None:
    ref, _ = recorder
    ref.stop(block=True)
    assert try_inline(ref, "step", "after stop") is None


async def test_a_handler_goes_on_on_the_loop_after_its_work_there_while_the_actor_is_idle(recorder: Any) -> None:
    _, proxy = recorder
    ready = asyncio.Event()
    reply = proxy.then_here(ready)
    await asyncio.sleep(0.05)  # the actor's thread has handed the work to the loop and is idle
    ready.set()
    assert await call(reply, 5) == ("worked", threading.get_ident())


async def test_an_error_of_the_loop_work_goes_to_the_actor_thread(recorder: Any) -> None:
    _, proxy = recorder
    ready = asyncio.Event()
    ready.set()
    outcome, thread = await call(proxy.then_here(ready, fail=True), 5)
    assert outcome == "the loop's work failed" and thread != threading.get_ident()


async def test_a_busy_actor_takes_the_outcome_on_its_own_thread(recorder: Any) -> None:
    _, proxy = recorder
    ready, gate = asyncio.Event(), threading.Event()
    reply = proxy.then_here(ready)
    await asyncio.sleep(0.05)
    busy = proxy.blocked(gate)  # the actor's thread holds a message when the work ends
    await asyncio.sleep(0.05)
    ready.set()
    await asyncio.sleep(0.05)
    actor = proxy.actor_ref.actor_inbox.owner()
    assert "then_here" not in [label for label, _ in actor.log]  # not taken past the message holding the actor
    gate.set()
    await call(busy, 5)
    outcome, thread = await call(reply, 5)
    assert outcome == "worked" and thread != threading.get_ident()


async def test_requests_that_waited_for_it_run_after_it_on_the_actor_thread(recorder: Any) -> None:
    ref, proxy = recorder
    ready = asyncio.Event()
    first = proxy.then_here(ready)
    await asyncio.sleep(0.05)
    queued = proxy.step("queued behind it")  # stashed by the actor's thread: its inbox is idle again
    await asyncio.sleep(0.05)
    assert "queued behind it" not in [label for label, _ in ref.actor_inbox.owner().log]
    ready.set()
    assert await call(first, 5) == ("worked", threading.get_ident())
    assert await call(queued, 5) != threading.get_ident()  # what it does may block: not on the loop
    labels = [label for label, _ in ref.actor_inbox.owner().log]
    assert labels[-2:] == ["then_here", "queued behind it"]


class LazyRecorder(Recorder):
    lazy_thread = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.allowed.add("then_here")


def _threads_of(ref: pykka.ActorRef[Any]) -> list[threading.Thread]:
    actor = _owner(ref)
    assert actor is not None  # the caller holds it
    return [t for t in threading.enumerate() if getattr(getattr(t, "_target", None), "__self__", None) is actor]


def _owner(ref: pykka.ActorRef[Any]) -> Any:
    inbox: Any = ref.actor_inbox
    return inbox.owner()


async def test_a_lazy_actor_handles_requests_inline_with_no_thread_until_a_message_comes() -> None:
    """`StagedActor.lazy_thread`: registered at `start`, its thread started by its first message."""
    ref = LazyRecorder.start(asyncio.get_running_loop())
    try:
        assert ref.is_alive() and ref in pykka.ActorRegistry.get_all()
        actor = _owner(ref)
        reply = try_inline(ref, "step", "inline, before any thread")
        assert reply is not None and await call(reply, 5) == threading.get_ident()
        ready = asyncio.Event()
        ready.set()
        reply = try_inline(ref, "then_here", ready)  # loop work, then on here: still no thread
        assert reply is not None and await call(reply, 5) == ("worked", threading.get_ident())
        assert not _threads_of(ref)
        # The first message starts the thread, which handles it.
        assert await call(ref.proxy().step("through the inbox"), 5) != threading.get_ident()
        assert len(_threads_of(ref)) == 1
        assert [label for label, _ in actor.log] == ["inline, before any thread", "then_here", "through the inbox"]
        assert try_inline(ref, "step", "inline again") is not None
        assert await call(ref.proxy().step("and again"), 5) != threading.get_ident()
        assert len(_threads_of(ref)) == 1  # started once
    finally:
        pykka.ActorRegistry.stop_all()


async def test_a_lazy_actors_step_on_its_own_thread_starts_it() -> None:
    """An inline handler that moves to the actor's thread (`ON_ACTOR_THREAD`), or whose loop work
    fails (its outcome goes there), finds it started."""
    ref = LazyRecorder.start(asyncio.get_running_loop())
    try:
        reply = try_inline(ref, "hop")
        assert reply is not None
        before, after = await call(reply, 5)
        assert before == threading.get_ident() and after != before
        fresh = LazyRecorder.start(asyncio.get_running_loop())
        ready = asyncio.Event()
        ready.set()
        reply = try_inline(fresh, "then_here", ready, True)
        assert reply is not None
        assert await call(reply, 5) == ("the loop's work failed", next(t.ident for t in _threads_of(fresh)))
    finally:
        pykka.ActorRegistry.stop_all()


async def test_a_lazy_actor_stopped_before_its_thread_started_stops() -> None:
    """By pykka's stop (its thread started to handle it), or by `stop_soon`: here, with no thread."""
    ref = LazyRecorder.start(asyncio.get_running_loop())
    ref.stop(block=True, timeout=5)
    assert not ref.is_alive() and ref not in pykka.ActorRegistry.get_all()

    ref = LazyRecorder.start(asyncio.get_running_loop())
    actor = _owner(ref)  # noqa: F841 - held, so that its threads can be looked for after its stop
    assert try_inline(ref, "step", "inline") is not None
    stop_soon(ref)
    assert not ref.is_alive() and ref not in pykka.ActorRegistry.get_all() and not _threads_of(ref)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell(_Step("too late"))

    # Busy (a request waits for its work): stopped by its thread, and the request is answered.
    ref = LazyRecorder.start(asyncio.get_running_loop())
    actor = _owner(ref)  # noqa: F841
    reply = try_inline(ref, "wait_for", concurrent.futures.Future())
    assert reply is not None
    stop_soon(ref)
    with pytest.raises(Unavailable):
        await asyncio.wrap_future(reply)
    assert not ref.is_alive()
    for thread in _threads_of(ref):  # it ends once its stop is handled
        thread.join(5)
        assert not thread.is_alive()


async def test_an_ask_that_saw_the_actor_alive_just_before_it_stopped_is_answered_at_once() -> None:
    """pykka's `ask` checks that the actor is alive, then puts its message in the inbox. An actor
    that stops in between (it retires on its own thread while the loop asks it, as session actors do
    on a runner) has already emptied its inbox for the last time: the message was never answered and
    its caller waited out its whole timeout. Here the put comes after the stop, as it does then."""
    for lazy in (False, True):
        ref = (LazyRecorder if lazy else Recorder).start(asyncio.get_running_loop())
        actor = _owner(ref)
        if not lazy:
            await call(ref.proxy().step("its thread runs"), 5)
        threads = _threads_of(ref)
        stop_soon(ref)  # a lazy one with no thread stops here, the other on its thread
        for thread in threads:
            thread.join(5)
        assert not ref.is_alive()
        late: pykka.Future[Any] = actor._create_future()
        ref.actor_inbox.put(Envelope(_Step("after its last look at its inbox"), reply_to=late))
        with pytest.raises(ActorGone):  # at once (asked again of a new actor); it used to wait for ever
            await call(late, 1)
        ref.actor_inbox.put(Envelope(_Step("a tell"), reply_to=None))  # nobody waits: dropped
        assert ref.actor_inbox.empty()


class Counter(TurnTakingActor):
    """A plain actor (the pool's kind) whose methods `call_inline` may run on the caller's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.bumps = 0

    def bump(self) -> int:
        self.bumps += 1
        return threading.get_ident()

    def blocked(self, gate: threading.Event) -> None:
        gate.wait(5)


async def test_call_inline_runs_a_method_of_an_idle_started_actor_on_the_callers_thread() -> None:
    ref = Counter.start()
    try:
        assert call_inline(ref, lambda actor: actor.bump()) == (False, None)  # its thread has handled nothing yet
        assert await call(ref.proxy().bump(), 5) != threading.get_ident()
        assert call_inline(ref, lambda actor: actor.bump()) == (True, threading.get_ident())
        gate = threading.Event()
        busy = ref.proxy().blocked(gate)
        await asyncio.sleep(0.05)
        assert call_inline(ref, lambda actor: actor.bump()) == (False, None)  # its thread holds its turn
        queued = ref.proxy().bump()
        gate.set()
        await call(busy, 5)
        await call(queued, 5)
        assert call_inline(ref, lambda actor: actor.bump()) == (True, threading.get_ident())
        assert _owner(ref).bumps == 4
    finally:
        pykka.ActorRegistry.stop_all()
