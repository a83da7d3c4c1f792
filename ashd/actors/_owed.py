"""Snapshots owed until a quiet moment: a pause's, and a DELETE's final one (`SnapshotActor`).

Any thread adds to it directly: a message to the snapshot actor would wake that actor's thread
beside the answer that owes the snapshot (0.2 ms of a pause's, measured; docs/performance.md, sixth
pass). Once the front end is quiet (`Activity`: no request in flight for a moment, at most 0.1 s)
the actor is told to take what is owed: by the loop itself when the Activity is bound to it (no
thread wakes before then), else by a thread of its own that waits for it. The actor also takes
what a session owes before anything else it does about that session (a read, a restore, a newer
snapshot), so nothing is ever answered from an older snapshot than the one owed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from ashd.actors._activity import Activity

# The workspace to snapshot, and what waits for that snapshot to be stored (a sandbox's release).
Owed = tuple[Path, list[concurrent.futures.Future[Any]]]


@dataclass(frozen=True)
class TakeOwed:
    """Told to the snapshot actor: take the snapshots that are owed now."""


class OwedSnapshots:
    def __init__(self, activity: Activity | None) -> None:
        self._activity = activity
        self._lock = threading.Lock()
        self._owed: dict[str, Owed] = {}
        self._signal = threading.Event()
        self._stopping = threading.Event()
        self._waiter: threading.Thread | None = None
        self._asked = False  # the loop was asked to tell the actor in the next quiet moment
        self._ref: pykka.ActorRef[Any] | None = None

    def attach(self, ref: pykka.ActorRef[Any]) -> None:
        """The actor that takes them (from its `on_start`)."""
        self._ref = ref

    @property
    def waits(self) -> bool:
        """Owed snapshots wait for a quiet moment (else they are taken at once)."""
        return self._activity is not None

    def add(self, session_id: str, workspace: Path, taken: concurrent.futures.Future[Any] | None = None, *,
            tell: bool = True) -> None:
        """Owe a snapshot of `workspace` for `session_id` (the newest replaces one owed before; what
        waited for that one waits for this one); `taken` is told its outcome. Without an Activity the
        actor is told at once (`tell=False`: the actor itself, which takes it there and then)."""
        activity = self._activity
        ask = False
        with self._lock:
            owed = self._owed.get(session_id)
            waiting = (owed[1] if owed is not None else []) + ([taken] if taken is not None else [])
            self._owed[session_id] = (workspace, waiting)
            if activity is not None and activity.bound:
                ask, self._asked = not self._asked, True
            elif activity is not None and self._waiter is None and not self._stopping.is_set():
                self._waiter = threading.Thread(target=self._wait_for_quiet, name="snapshot-quiet", daemon=True)
                self._waiter.start()
        if activity is None:
            if tell:
                self._tell()  # nothing to wait for
        elif not activity.bound:
            self._signal.set()
        elif ask:
            try:
                activity.when_quiet(self._quiet)
            except RuntimeError:  # the loop is closed: the stopping actor takes what is owed
                with self._lock:
                    self._asked = False

    def _quiet(self, _quiet: bool) -> None:  # on the loop, in a quiet moment (or at the bound)
        with self._lock:
            self._asked = False
        if not self._stopping.is_set():
            self._tell()

    def pop(self, session_id: str) -> Owed | None:
        with self._lock:
            return self._owed.pop(session_id, None)

    def put_back(self, session_id: str, owed: Owed) -> None:
        """Owed again (a full disk refused it), unless something newer is owed meanwhile."""
        with self._lock:
            self._owed.setdefault(session_id, owed)

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._owed)

    def stop(self) -> None:
        self._stopping.set()
        self._signal.set()

    def _wait_for_quiet(self) -> None:
        activity = self._activity
        assert activity is not None
        while not self._stopping.is_set():
            self._signal.wait()
            self._signal.clear()
            if self._stopping.is_set():
                return
            activity.wait_quiet(stop=self._stopping)
            self._tell()

    def _tell(self) -> None:
        if self._ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.tell(TakeOwed())
