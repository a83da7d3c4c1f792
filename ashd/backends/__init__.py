"""Where sessions run, behind one seam: `SessionBackend`, and `LocalBackend` (this process's actors)."""

from ashd.backends._local import BundleConfig, LocalBackend, latest_snapshot, snapshot_reader
from ashd.backends._protocol import Bundle, Files, Frame, Message, NewSession, SessionBackend, SessionView, Turn
from ashd.backends._turn_driver import TurnDriver

__all__ = [
    "Bundle",
    "BundleConfig",
    "Files",
    "Frame",
    "LocalBackend",
    "Message",
    "NewSession",
    "SessionBackend",
    "SessionView",
    "Turn",
    "TurnDriver",
    "latest_snapshot",
    "snapshot_reader",
]
