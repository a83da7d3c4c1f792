"""Reaping the orphans a bridge inherits when it is its sandbox's pid 1.

On the zygote route the bridge is the init of its pid namespace (ashd/zygote/_child.py), so every
process whose parent exits is handed to it: a command's background job, a daemon's second fork.
Unreaped, each stays a zombie holding one of the sandbox's pids until the pids limit refuses the
next command. A classic init reaps with `waitpid(-1)`, which would also take the exit status of
the bridge's own children (asyncio's child watcher waits for each by pid), so this reaper takes
only zombies that no one else waits for:

- A child the bridge starts is in the bridge's session or leads its own (`start_new_session`);
  a zombie child in any other session was adopted, and is reaped at once.
- Any other zombie child (an adopted session leader, which a daemon's `setsid` makes, or an
  adopted process of the bridge's session) is reaped once it has stayed a zombie for `GRACE`
  seconds: asyncio reaps its own children within a loop iteration of their exit.

It runs on SIGCHLD, which the kernel sends pid 1 for adopted children as for its own; the signals
of one loop iteration (a command's whole process group ending) make one sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

GRACE = 1.0  # seconds a zombie that could be the bridge's own is left to its waiter


def zombie_children(parent: int, proc: str = "/proc") -> list[tuple[int, int]]:
    """(pid, session id) of every zombie whose parent is `parent`."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] == b"Z" and int(fields[1]) == parent:
            found.append((int(name), int(fields[3])))
    return found


class OrphanReaper:
    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float = GRACE) -> None:
        self.loop = loop
        self.grace = grace
        self.pid = os.getpid()
        self.session = os.getsid(0)
        self.reaped = 0
        self._first_seen: dict[int, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._pending = False

    def install(self) -> None:
        self.loop.add_signal_handler(signal.SIGCHLD, self._on_sigchld)
        self.sweep()  # what was adopted before the handler was there

    def _on_sigchld(self) -> None:
        if not self._pending:
            self._pending = True
            self.loop.call_soon(self.sweep)

    def close(self) -> None:
        with contextlib.suppress(ValueError, RuntimeError):
            self.loop.remove_signal_handler(signal.SIGCHLD)
        if self._timer is not None:
            self._timer.cancel()

    def sweep(self) -> None:
        self._pending = False
        now = time.monotonic()
        waiting: dict[int, float] = {}
        for pid, session in zombie_children(self.pid):
            if session not in (self.session, pid):
                self._reap(pid)
                continue
            first = self._first_seen.get(pid, now)
            if now - first >= self.grace:
                self._reap(pid)
            else:
                waiting[pid] = first
        self._first_seen = waiting
        if waiting and self._timer is None:
            delay = max(0.0, min(waiting.values()) + self.grace - now)
            self._timer = self.loop.call_later(delay + 0.01, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.sweep()

    def _reap(self, pid: int) -> None:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # its own waiter took it first
            return
        if done:
            self.reaped += 1
            log.debug("reaped orphan %d", pid)
