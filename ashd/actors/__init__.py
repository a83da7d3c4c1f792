"""Actors (pykka) and the one asyncio↔actor bridge (`_aio`)."""

from ashd.actors._activity import Activity
from ashd.actors._aio import AioActor, Later, call, pipe_to_actor, spawn_on_loop, stop_actor, tell_loop
from ashd.actors._board import EMPTY_POOL_STATS, StatsBoard
from ashd.actors._liveness import LivenessConfig, RunnerLiveness
from ashd.actors._owed import OwedSnapshots
from ashd.actors._pool import PoolActor, PoolConfig, default_capacity
from ashd.actors._pool import count_resume as count_pool_resume
from ashd.actors._pool_types import SandboxHandle, SandboxLost
from ashd.actors._queue import QueueActor, QueueConfig, QueueService, RunItem
from ashd.actors._runners import LOCAL_POOL_STAT, RunnerInfo, RunnerRegistryActor, choose
from ashd.actors._session import SessionActor
from ashd.actors._session_deps import CreateRequest, SendQuery, SentQuery, SessionDeps, TurnTicket
from ashd.actors._session_logs import LogTails, SetupSink
from ashd.actors._sessions import SessionRegistry
from ashd.actors._snapshot import SnapshotActor, snapshot_proxy
from ashd.actors._staged import OnLoop, Stage, StagedActor, staged
from ashd.actors._turn import TurnLimitReached, TurnLimits, TurnRecorder, retrying
from ashd.actors._warmer import Warmer
from ashd.actors._webhooks import DispatchConfig, WebhookDispatcher, sign

__all__ = [
    "EMPTY_POOL_STATS",
    "LOCAL_POOL_STAT",
    "Activity",
    "AioActor",
    "CreateRequest",
    "DispatchConfig",
    "Later",
    "LivenessConfig",
    "LogTails",
    "OnLoop",
    "OwedSnapshots",
    "PoolActor",
    "PoolConfig",
    "QueueActor",
    "QueueConfig",
    "QueueService",
    "RunItem",
    "RunnerInfo",
    "RunnerLiveness",
    "RunnerRegistryActor",
    "SandboxHandle",
    "SandboxLost",
    "SendQuery",
    "SentQuery",
    "SessionActor",
    "SessionDeps",
    "SessionRegistry",
    "SetupSink",
    "SnapshotActor",
    "Stage",
    "StagedActor",
    "StatsBoard",
    "TurnLimitReached",
    "TurnLimits",
    "TurnRecorder",
    "TurnTicket",
    "Warmer",
    "WebhookDispatcher",
    "call",
    "choose",
    "count_pool_resume",
    "default_capacity",
    "pipe_to_actor",
    "retrying",
    "sign",
    "snapshot_proxy",
    "spawn_on_loop",
    "staged",
    "stop_actor",
    "tell_loop",
]
