"""Wait for room on a full disk: a callback once the filesystem's free space has grown.

A snapshot owed on a full data disk (a DELETE's final one, which its sandbox waits for) is retried
as soon as there is room, not on the next tick of a long timer: the operator who frees space sees
the snapshot written, and the sandbox it holds let go, within a second. `statvfs` costs about a
microsecond, so polling it once a second while something waits costs nothing; nothing polls when
nothing waits. Growth is measured from the free space right after the refusal (the refused write's
partial file already removed), so one retry is made per step of room, not one per poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ashd.storage import free_bytes

POLL_S = 1.0
STEP_BYTES = 1024 * 1024


class RoomWatch:
    """Calls `on_room` (on its own thread) once `path`'s filesystem has `step` bytes more free
    than when `watch` was called; one watch at a time, started again by the next `watch`."""

    def __init__(self, path: Path, on_room: Callable[[], None], poll_s: float = POLL_S,
                 step: int = STEP_BYTES) -> None:
        self.path, self.on_room, self.poll_s, self.step = path, on_room, poll_s, step
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    @property
    def watching(self) -> bool:
        return self._stop is not None

    def watch(self) -> None:
        """Start watching from the free space now, unless a watch is already running (it keeps its
        own starting point: the refusal that started it)."""
        with self._lock:
            if self._stop is not None:
                return
            try:
                since = free_bytes(self.path)
            except OSError:
                return  # the data dir is gone (the server is stopping): the caller's timer remains
            stop = self._stop = threading.Event()
        threading.Thread(target=self._run, args=(stop, since), name="snapshot-room", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            if self._stop is not None:
                self._stop.set()
                self._stop = None

    def _run(self, stop: threading.Event, since: int) -> None:
        while not stop.wait(self.poll_s):
            try:
                grown = free_bytes(self.path) >= since + self.step
            except OSError:
                grown = False
            if grown:
                with self._lock:
                    if self._stop is stop:
                        self._stop = None
                if not stop.is_set():
                    self.on_room()
                return
