"""Where sessions run, behind one seam: `SessionBackend`; `LocalBackend` (this process's actors),
`RemoteBackend` (one runner's API) and `RoutingBackend` (a coordinator: each session to its runner)."""

from ashd.backends._attachments import check_ids as check_attachment_ids
from ashd.backends._local import BundleConfig, LocalBackend, latest_snapshot, snapshot_reader
from ashd.backends._protocol import Bundle, Files, Frame, Message, NewSession, SessionBackend, SessionView, Turn
from ashd.backends._queue_turn import QueueTurns
from ashd.backends._remote import (
    DRAINING_HEADER,
    FULL_HEADER,
    RemoteBackend,
    RunnerClient,
    RunnerDidNotTake,
    RunnerUnreachable,
    parse_frame,
)
from ashd.backends._replay import stored_replay
from ashd.backends._routing import NO_RUNNERS, RoutingBackend
from ashd.backends._turn_driver import TurnDriver

__all__ = [
    "DRAINING_HEADER",
    "FULL_HEADER",
    "NO_RUNNERS",
    "Bundle",
    "BundleConfig",
    "Files",
    "Frame",
    "LocalBackend",
    "Message",
    "NewSession",
    "QueueTurns",
    "RemoteBackend",
    "RoutingBackend",
    "RunnerClient",
    "RunnerDidNotTake",
    "RunnerUnreachable",
    "SessionBackend",
    "SessionView",
    "Turn",
    "TurnDriver",
    "check_attachment_ids",
    "latest_snapshot",
    "parse_frame",
    "snapshot_reader",
    "stored_replay",
]
