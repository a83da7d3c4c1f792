"""A server process's life: start its parts, wait for SIGTERM or SIGINT, then stop them gracefully,
newest first.

`ashd serve` and `ashd runner` share this shape; what starting and stopping mean is theirs. Light
on purpose: the CLI imports it without the actors and sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from contextlib import suppress

log = logging.getLogger(__name__)
# One step of a graceful stop, with its name for the log: registered as its part starts.
StopStep = Callable[[], Awaitable[None]]


async def run_until_signalled(start: Callable[[], Awaitable[object]], stop: Callable[[], Awaitable[object]],
                              logger: logging.Logger, stopping: str) -> None:
    """`start`, then wait for a stop signal and log `stopping`; `stop` runs however this ends (a
    failed start included), and a failure while stopping never hides the one that got us here."""
    requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, requested.set)
    try:
        await start()
        await requested.wait()
        logger.info(stopping)
    finally:
        with suppress(Exception):
            await stop()


async def unwind(stops: list[tuple[str, StopStep]]) -> None:
    """Stop what was started, newest first; a step that fails is logged and the rest still stop."""
    while stops:
        name, step = stops.pop()
        try:
            await step()
        except Exception:
            log.exception("stopping %s failed", name)
