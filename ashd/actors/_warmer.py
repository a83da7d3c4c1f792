"""Loop-side preparation of pre-warmed sandboxes: the bridge connection and the model proxy socket
are made while the sandbox waits in the pool, so a claim only has to send `init`.

The pool tells `prepare` (from its thread) when a generic sandbox becomes warm, and `discard` when
one it never handed out is destroyed. A claimer takes the preparation with `take`; the pool only
prepares sandboxes nobody has claimed, and the task is created before the claim can be answered,
so a claimer never races the warmer for the bridge's single connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ashd.actors._aio import tell_loop
from ashd.sandboxing import SandboxPaths

log = logging.getLogger(__name__)


class Warmer:
    def __init__(self, loop: asyncio.AbstractEventLoop, model_proxy: Any, connect_timeout: float) -> None:
        self._loop = loop
        self._proxy = model_proxy
        self._timeout = connect_timeout
        self._ready: dict[str, asyncio.Task[Any]] = {}

    # --- called from the pool's thread ---------------------------------------------------------
    def prepare(self, sandbox_id: str, paths: SandboxPaths,
                on_ready: Callable[[str, bool], None] | None = None) -> None:
        """Connect to the spare's bridge; `on_ready(sandbox_id, ok)` is called on the loop once its
        `ready` came (or the connect failed): the pool's readiness probe, since the bridge's socket
        listens from the launch on (`sandboxing/_activation.py`) and only the answer says the bridge
        is up."""
        tell_loop(self._loop, self._start, sandbox_id, paths, on_ready)

    def discard(self, sandbox_id: str) -> None:
        tell_loop(self._loop, self._drop, sandbox_id)

    # --- on the loop ---------------------------------------------------------------------------
    def _start(self, sandbox_id: str, paths: SandboxPaths, on_ready: Callable[[str, bool], None] | None) -> None:
        if sandbox_id not in self._ready:
            task = self._loop.create_task(self._connect(sandbox_id, paths))
            self._ready[sandbox_id] = task
            if on_ready is not None:
                # Cancelled (dropped: the spare is going): nothing to say about the bridge.
                task.add_done_callback(lambda t: None if t.cancelled() else on_ready(sandbox_id, t.exception() is None))

    async def _connect(self, sandbox_id: str, paths: SandboxPaths) -> Any:
        from ashd.sandboxing import BridgeConnection

        if self._proxy is not None:
            await self._proxy.start_for(sandbox_id, paths.model_socket)
        return await BridgeConnection.connect(str(paths.bridge_socket), timeout=self._timeout)

    def take(self, sandbox_id: str) -> asyncio.Task[Any] | None:
        return self._ready.pop(sandbox_id, None)

    def _drop(self, sandbox_id: str) -> None:
        task = self._ready.pop(sandbox_id, None)
        if task is not None:
            self._loop.create_task(self._close(sandbox_id, task))

    async def _close(self, sandbox_id: str, task: asyncio.Task[Any]) -> None:
        task.cancel()
        with contextlib.suppress(BaseException):
            conn = await task
            await conn.close()
        if self._proxy is not None:
            await self._proxy.stop_for(sandbox_id)

    async def close(self) -> None:
        for sandbox_id in list(self._ready):
            task = self._ready.pop(sandbox_id)
            await self._close(sandbox_id, task)
