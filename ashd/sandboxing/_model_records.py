"""One record per model call the proxy answered, and the writer that stores them off the hot path.

Records are queued in memory as calls finish and written in batches (every `INTERVAL` seconds or
`BATCH` records, whichever comes first) by the injected `store` (the configured database). The turn
flushes them before its `done` frame and the proxy at every sandbox detach and at shutdown. A batch
that cannot be stored stays queued and is retried with a growing delay; only if the process stops
while storage is still failing are the records written to the error log instead (one JSON line
each), so that even then they are not lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from ashd.storage import ModelCallRecord

log = logging.getLogger(__name__)
INTERVAL = 0.05
BATCH = 128
MAX_QUEUED = 100_000
RETRY_MAX_S = 30.0


Store = Callable[[Sequence[ModelCallRecord]], Awaitable[None]]


class RecordWriter:
    def __init__(self, store: Store | None) -> None:
        self._store = store
        self._queue: list[ModelCallRecord] = []
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._retry_delay = 0.0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def add(self, record: ModelCallRecord) -> None:
        """On the loop; never waits."""
        if self._store is not None:
            self._queue.append(record)
            self._queued()

    def put_back(self, records: Sequence[ModelCallRecord]) -> None:
        """Queue records (on the loop; never waits) that were taken (`take`) by a turn that could not
        store them."""
        if self._store is not None and records:
            self._queue.extend(records)
            self._queued()

    def _queued(self) -> None:
        if len(self._queue) > MAX_QUEUED:  # storage has been failing for a long time: spill the oldest
            self._spill(self._queue[:-MAX_QUEUED])
            del self._queue[:-MAX_QUEUED]
        if self._task is None or self._task.done():
            delay = self._retry_delay or (0.0 if len(self._queue) >= BATCH else INTERVAL)
            self._task = asyncio.get_running_loop().create_task(self._later(delay))

    async def _later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - logged in flush; retried by the next add or flush
            if self._queue:
                self._task = asyncio.get_running_loop().create_task(self._later(self._retry_delay))

    async def take(self, query_id: str) -> list[ModelCallRecord]:
        """The queued records of one turn's calls, out of the queue: the turn stores them in its last
        transaction, with its `done` (one trip to the database where a flush would be a second).
        A batch being stored when this is called is waited for: it may hold some of them."""
        if self._store is None:
            return []
        async with self._lock:  # `flush` takes its batch from the front of the queue under it
            mine = [r for r in self._queue if r.query_id == query_id]
            if mine:
                self._queue = [r for r in self._queue if r.query_id != query_id]
            return mine

    async def flush(self) -> None:
        """Store everything queued so far; on failure the records stay queued and this raises."""
        if self._store is None:
            return
        async with self._lock:
            while self._queue:
                batch = self._queue[:BATCH * 8]
                try:
                    await asyncio.shield(self._store(batch))
                except Exception as exc:
                    if not self._retry_delay:  # one line per outage, not one per retry
                        log.warning("storing model call records failed (%s: %s); they are kept and retried",
                                    type(exc).__name__, exc, extra={"queued": len(self._queue)})
                    self._retry_delay = min(RETRY_MAX_S, max(0.5, self._retry_delay * 2))
                    raise
                if self._retry_delay:
                    log.info("model call records stored again after a storage failure")
                self._retry_delay = 0.0
                del self._queue[:len(batch)]

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - last resort below
            self._spill(self._queue)
            self._queue = []

    @staticmethod
    def _spill(records: Sequence[ModelCallRecord]) -> None:
        for rec in records:
            log.error("model call record not stored", extra={"record": json.dumps(rec.to_json())})
