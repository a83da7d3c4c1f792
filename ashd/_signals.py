"""A server process's life: start its parts, wait for SIGTERM or SIGINT, then stop them gracefully.

`ashd serve` and `ashd runner` share this shape; what starting and stopping mean is theirs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from contextlib import suppress


async def run_until_signalled(start: Callable[[], Awaitable[object]], stop: Callable[[], Awaitable[object]],
                              log: logging.Logger, stopping: str) -> None:
    """`start`, then wait for a stop signal and log `stopping`; `stop` runs however this ends (a
    failed start included), and a failure while stopping never hides the one that got us here."""
    requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, requested.set)
    try:
        await start()
        await requested.wait()
        log.info(stopping)
    finally:
        with suppress(Exception):
            await stop()
