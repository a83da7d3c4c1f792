"""Work the engine starts in the background and waits for later (MCP servers, a spare connection)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


def retrieve(future: asyncio.Future[Any]) -> None:
    """A done callback: the outcome is read, so that asyncio does not report an exception nobody
    awaited (whoever needs the work finds out for itself)."""
    if not future.cancelled():
        future.exception()


async def wait_started(starting: asyncio.Future[Any] | None, what: str) -> None:
    """Wait for `starting` to end. Only this wait's own cancellation is raised (an interrupted
    query), and it leaves `starting` running; `starting` cancelled (its owner is closing) or failed
    ends the wait, a failure logged as `what`."""
    if starting is None:
        return
    if not starting.done():
        await asyncio.wait([starting])  # (its cancellation leaves `starting` be; its outcome is not raised)
    if not starting.cancelled() and starting.exception() is not None:
        log.info("%s: %s", what, starting.exception())
