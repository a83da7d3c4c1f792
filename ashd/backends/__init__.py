"""Where sessions run, behind one seam: `SessionBackend`, and `LocalBackend` (this process's actors)."""

from ashd.backends._local import LocalBackend, snapshot_reader
from ashd.backends._protocol import Files, Frame, Message, NewSession, SessionBackend, SessionView, Turn
from ashd.backends._turn_driver import TurnDriver

__all__ = [
    "Files",
    "Frame",
    "LocalBackend",
    "Message",
    "NewSession",
    "SessionBackend",
    "SessionView",
    "Turn",
    "TurnDriver",
    "snapshot_reader",
]
