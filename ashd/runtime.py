"""Actors and sandboxes of a running server: started after storage, stopped before it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ashd.services import Services

StopStep = Callable[[], Awaitable[None]]


async def start(services: Services) -> list[tuple[str, StopStep]]:
    return []


async def drain(services: Services) -> None:
    """Graceful shutdown, before HTTP connections close: let running turns finish, end streams."""
