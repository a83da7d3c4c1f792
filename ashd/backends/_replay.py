"""Replay of a session's stream from the shared database alone (GET /api/sessions/{id}/stream).

Stored frames after `after`, then new ones as the turn's recorder stores them, for as long as the
session's `turn_open` says a turn is running. Nothing here asks the process that runs the turn:
any coordinator (or standalone server) on the same database answers the same frames, so a client
whose coordinator died reconnects anywhere with Last-Event-ID and misses nothing.

The process that runs the turn itself knows better than the database whether it still runs: a turn
whose end could not be stored (the data disk stayed full) leaves `turn_open` set, and a follower
polling it would never end. `LocalBackend` passes its session actors' answer as `running`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

from ashd.backends._protocol import Frame
from ashd.storage import Sessions

# Followers of a running turn poll storage, which the turn's recorder writes in small batches.
REPLAY_POLL = 0.05


async def stored_replay(sessions: Sessions, tenant: str, session_id: str, after: int,
                        running: Callable[[], Awaitable[bool]] | None = None) -> AsyncGenerator[Frame, None]:
    """Checks the session (404 before any frame), then answers the frames after `after`, until no
    turn runs: as `running()` says, or else as the session's `turn_open`."""
    await sessions.get(tenant, session_id)
    return _frames(sessions, session_id, after, running)


async def _frames(sessions: Sessions, session_id: str, after: int,
                  running: Callable[[], Awaitable[bool]] | None) -> AsyncGenerator[Frame, None]:
    idle_rounds = 0
    while True:
        frames = await sessions.frames_after(session_id, after)
        for frame in frames:
            yield Frame(frame.event, frame.data, frame.sequence)
            after = frame.sequence
        if frames:
            idle_rounds = 0
            continue
        if running is not None:
            still = await running()
        else:
            row = await sessions.get_any(session_id)
            still = row is not None and row.turn_open
        if not still:
            idle_rounds += 1
            if idle_rounds > 1:  # nothing running and nothing new after a last look: done
                return
        await asyncio.sleep(REPLAY_POLL)
