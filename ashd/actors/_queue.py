"""The queue: a `QueueActor` that decides when to claim and start items, and its loop-side service.

The actor holds the scheduling state (which items this server runs, whether a claim is under way)
and nothing else: the claims (database) and the items' turns are coroutines it starts on the loop
with `spawn_on_loop`, which report back to it with a tell. So no actor thread ever waits for the
database or a model. `QueueService` lives on the loop: a ticker that wakes the actor, renews this
server's leases and gives the items of dead servers back to `pending`; `close()` stops claiming,
waits a little for running items and hands what is left back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pykka

from ashd.actors._aio import AioActor, call, spawn_on_loop, stop_actor
from ashd.storage import Claimed, QueueItems

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueConfig:
    owner: str  # this server (its claims name it)
    capacity: int  # items this server runs at once
    per_tenant: int  # items one tenant runs at once, over all servers
    lease_s: float
    timeout: float  # actor asks


RunItem = Callable[[Claimed], Awaitable[None]]  # runs a claimed item to its end and records the outcome


class QueueActor(AioActor):
    def __init__(self, loop: asyncio.AbstractEventLoop, items: QueueItems, run: RunItem, config: QueueConfig) -> None:
        super().__init__()
        self._loop = loop
        self._items = items
        self._run = run
        self._config = config
        self._running: set[str] = set()
        self._claiming = False
        self._again = False  # a kick came while a claim was under way: claim again after it
        self._paused = False
        self._me: Any = None

    def on_start(self) -> None:
        self._me = self.actor_ref.proxy()

    # --- messages ------------------------------------------------------------------------------
    def kick(self) -> None:
        """There may be due items: claim as many as there is room for."""
        if self._paused:
            return
        if self._claiming:
            self._again = True
            return
        free = self._config.capacity - len(self._running)
        if free <= 0:
            return
        self._claiming, self._again = True, False
        spawn_on_loop(self._loop, self._claim(free), "claiming queue items")

    def claimed(self, items: list[Claimed]) -> None:
        self._claiming = False
        for item in items:
            self._running.add(item.id)
            spawn_on_loop(self._loop, self._execute(item), f"running queue item {item.id}")
        if self._again:
            self.kick()

    def finished(self, item_id: str) -> None:
        self._running.discard(item_id)
        self.kick()

    def pause(self) -> None:
        """No new claims (the server is stopping); running items go on."""
        self._paused = True

    def running(self) -> int:
        return len(self._running)

    # --- on the loop ---------------------------------------------------------------------------
    async def _claim(self, count: int) -> None:
        items: list[Claimed] = []
        try:
            items = await self._items.claim(self._config.owner, self._config.lease_s, self._config.per_tenant, count)
        except Exception as exc:  # noqa: BLE001 - the next tick tries again
            log.warning("could not claim queue items: %s", exc)
        finally:
            self._tell("claimed", items)

    async def _execute(self, item: Claimed) -> None:
        try:
            await self._run(item)
        finally:
            self._tell("finished", item.id)

    def _tell(self, method: str, *args: Any) -> None:
        tell(self._me, method, *args)


def tell(proxy: Any, method: str, *args: Any) -> None:
    """Call an actor method through its proxy without waiting for it; a stopped actor is ignored
    (the server is stopping), and so is the reply future's outcome."""
    try:
        future = getattr(proxy, method)(*args)
    except pykka.ActorDeadError:
        return
    aio = getattr(future, "aio", None)
    if aio is not None:
        aio.add_done_callback(lambda f: f.cancelled() or f.exception())


class QueueService:
    """The queue actor and its ticker, on the loop. `kick()` after adding an item starts it at once."""

    def __init__(self, items: QueueItems, run: RunItem, config: QueueConfig) -> None:
        self._items = items
        self._config = config
        self._live: set[str] = set()  # the items whose turns run here now (on the loop): their leases are renewed
        self._ref = QueueActor.start(asyncio.get_running_loop(), items, self._tracked(run), config)
        self._proxy = self._ref.proxy()
        self._tick_s = max(0.05, min(1.0, config.lease_s / 3))
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def _tracked(self, run: RunItem) -> RunItem:
        async def tracked(item: Claimed) -> None:
            self._live.add(item.id)
            try:
                await run(item)
            finally:
                self._live.discard(item.id)

        return tracked

    def kick(self) -> None:
        tell(self._proxy, "kick")

    async def running(self) -> int:
        try:
            return int(await call(self._proxy.running(), self._config.timeout))
        except Exception:  # noqa: BLE001 - a stopped actor runs nothing
            return 0

    async def quiesce(self) -> None:
        tell(self._proxy, "pause")

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        renew_every = self._config.lease_s / 3
        last_renew = loop.time()
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                if loop.time() - last_renew >= renew_every:
                    last_renew = loop.time()
                    await self._items.renew(self._config.owner, set(self._live), self._config.lease_s)
                    back = await self._items.reclaim_expired()
                    if back:
                        log.info("queue items of a server that stopped renewing its claims are pending again",
                                 extra={"count": back})
            except Exception as exc:  # noqa: BLE001 - the database may be down for a while; keep ticking
                log.warning("queue housekeeping failed: %s", exc)
            self.kick()

    async def close(self, grace_s: float) -> None:
        await self.quiesce()
        deadline = asyncio.get_running_loop().time() + grace_s
        while await self.running() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        self._ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._ticker
        await stop_actor(self._ref, self._config.timeout)
        released = await self._items.release(self._config.owner)
        if released:
            log.info("queue items this server was running are pending again", extra={"count": released})
