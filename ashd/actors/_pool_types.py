"""Messages and values of the PoolActor.

Pool sandbox states (docs/pool.md):

    cold ──launch──► warming ──bridge ready──► warm ──claim──► waiting ⇄ running
      │                 │  (claimed while warming: assigned, counted as warming until ready)
      └────────────── any state ──destroy──► (gone)

`warm` sandboxes are generic (no tenant, no session). A claimed sandbox belongs to one session
and is destroyed when released, never returned to the warm set, so tenants never share one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ashd.sandboxing import SandboxPaths


class PoolState(enum.Enum):
    COLD = "cold"
    WARMING = "warming"
    WARM = "warm"
    WAITING = "waiting"
    RUNNING = "running"


@dataclass(frozen=True)
class SandboxHandle:
    sandbox_id: str
    paths: SandboxPaths
    prewarmed: bool  # taken from the warm set (bridge already up)
    # The sandbox's ResourceMeter (OOM kills, refused forks, a full disk), read by the turn.
    meter: Any = None
    disk_bytes: int = 0
    # Whether the pool still holds this sandbox and its process runs: read from the session's
    # thread without asking the pool (a warm resume checks it). None: ask the pool (`is_alive`).
    alive: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    # Mark it running (False: gone, or being taken away) and waiting again, from the session's
    # thread without asking the pool (`PoolActor._hold`). None: ask (`mark_running`, `mark_waiting`).
    hold: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    unhold: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    # Say, from the session's thread, that it lets the sandbox go (its release is on its way to
    # the pool): the bridge's exit on the shutdown it is asked for is then no crash.
    letting_go: Callable[[], None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Launching:
    """A claim's answer when no spare could serve it: the pool launches a sandbox off its thread
    (its disk image and process take 5-20 ms, during which other claims and asks are answered), and
    `handle` resolves once it is launched, or with the launch's error. The sandbox is the claiming
    session's from now on: a claimer that gives up releases `sandbox_id`."""

    sandbox_id: str
    handle: Future[SandboxHandle] = field(compare=False, repr=False)


class LossReason(enum.Enum):
    EVICTED = "evicted"  # capacity was needed; a snapshot was taken first
    IDLE = "idle"  # the idle sweep stopped it; a snapshot was taken first
    EXITED = "exited"  # the sandbox process died (crash, OOM, killed)


@dataclass(frozen=True)
class SandboxLost:
    """Told (never asked) to the session side when the pool takes a session's sandbox away."""

    session_id: str
    sandbox_id: str
    reason: LossReason
    detail: str
