"""Actors (pykka) and the one asyncio↔actor bridge (`_aio`)."""

from ashd.actors._aio import AioActor, call, run_on_loop, spawn_on_loop, stop_actor, tell_loop
from ashd.actors._board import StatsBoard
from ashd.actors._pool import PoolActor, PoolConfig, default_capacity
from ashd.actors._pool_types import SandboxHandle, SandboxLost
from ashd.actors._session import SessionActor
from ashd.actors._session_deps import CreateRequest, SessionDeps, TurnTicket
from ashd.actors._sessions import SessionRegistry
from ashd.actors._snapshot import SnapshotActor, snapshot_proxy
from ashd.actors._turn import TurnLimitReached, TurnLimits, TurnRecorder, retrying
from ashd.actors._warmer import Warmer

__all__ = [
    "AioActor",
    "CreateRequest",
    "PoolActor",
    "PoolConfig",
    "SandboxHandle",
    "SandboxLost",
    "SessionActor",
    "SessionDeps",
    "SessionRegistry",
    "SnapshotActor",
    "StatsBoard",
    "TurnLimitReached",
    "TurnLimits",
    "TurnRecorder",
    "TurnTicket",
    "Warmer",
    "call",
    "default_capacity",
    "retrying",
    "run_on_loop",
    "snapshot_proxy",
    "spawn_on_loop",
    "stop_actor",
    "tell_loop",
]
