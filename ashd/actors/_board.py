"""A published, read-only snapshot of an actor's counters.

The owner actor replaces the snapshot on every change; readers (health, metrics, benchmarks) read
it without asking the actor, so monitoring never waits behind the actor's inbox.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType


class StatsBoard:
    def __init__(self, initial: Mapping[str, int]) -> None:
        self._current: Mapping[str, int] = MappingProxyType(dict(initial))
        # Counters other threads bump themselves (`count`): a tell to the owner for each would wake
        # its thread beside the request that counts (a warm resume's, docs/performance.md).
        self._counted: dict[str, int] = {}
        self._lock = threading.Lock()

    def publish(self, stats: Mapping[str, int]) -> None:
        with self._lock:
            # A single reference assignment is atomic under the GIL: readers see old or new, never half.
            self._current = MappingProxyType({**stats, **self._counted})

    def count(self, name: str) -> None:
        """Add one to a counter the board keeps itself, from any thread."""
        with self._lock:
            self._counted[name] = self._counted.get(name, 0) + 1
            self._current = MappingProxyType({**self._current, **self._counted})

    def read(self) -> Mapping[str, int]:
        return self._current


EMPTY_POOL_STATS: Mapping[str, int] = MappingProxyType({
    "total": 0, "cold": 0, "warming": 0, "warm": 0, "waiting": 0, "running": 0,
    "maxCapacity": 0, "resumeWarmHits": 0, "resumeColdHits": 0, "preWarmHits": 0,
})
