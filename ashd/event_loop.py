"""The event loop a server process runs (`SERVICE_EVENT_LOOP`): uvloop's when it is installed,
asyncio's own otherwise or when asked for.

uvloop runs the loop in C on libuv: each request's reads and writes, each wake-up by another thread
(an actor's answer, a database thread's result) and each timer cost less interpreter time than in
asyncio's selector loop, on a server whose short requests are mostly such steps
(docs/performance.md, seventeenth pass). Everything ashd does on its loop is plain asyncio, so
either loop runs it; `asyncio` is there for a platform without uvloop's wheels, and to rule the
loop out when chasing a problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHOICES = ("auto", "uvloop", "asyncio")


class LoopUnavailable(RuntimeError):
    pass


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop `choice` names; None for asyncio's default."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "auto":
            return None
        raise LoopUnavailable("SERVICE_EVENT_LOOP is uvloop, but uvloop is not installed: install it "
                              "(`pip install uvloop`) or set SERVICE_EVENT_LOOP to auto or asyncio") from exc
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """`asyncio.run(main)` on the loop `choice` names."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """`uvloop` or `asyncio`: which loop this coroutine runs on (for the start's log line)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
