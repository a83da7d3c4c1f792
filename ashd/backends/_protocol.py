"""The seam between the HTTP layer and wherever a session runs.

`http/` speaks to sessions only through `SessionBackend`. `LocalBackend` runs them in this process
(the pool and session actors); coordinator mode will add one that forwards to a runner. Everything
that crosses the seam is plain data (views are the interface's JSON objects, a turn is a stream of
SSE frames), so a network can sit in the middle without the HTTP layer noticing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from ashd.storage import AgentFile, FileSource

SessionView = dict[str, Any]  # the interface's Session object


@dataclass(frozen=True)
class Frame:
    """One SSE frame: `event` is message, error or done; `id` is its stored sequence (None: live only)."""

    event: str
    data: str
    id: int | None = None


@dataclass(frozen=True)
class NewSession:
    """A checked POST /api/sessions: the agent exists, the tenant has room, the values are valid."""

    session_id: str
    tenant: str
    agent_name: str
    model: str | None
    config: dict[str, Any] = field(default_factory=dict)
    credential_id: str | None = None
    encrypted_env: bytes | None = None
    agent: Any = None  # the AgentView resolved when the request was checked; resolved again if None


@dataclass(frozen=True)
class Message:
    """A checked POST /api/sessions/{id}/messages."""

    content: Any  # a string or a list of content blocks
    model: str | None = None
    include_partial_messages: bool = False
    max_budget_usd: float | None = None
    # maxTurns, effort, thinking, outputFormat: checked, as the bridge's `query` frame fields.
    options: dict[str, Any] = field(default_factory=dict)
    # Ids of the session's attachments the message names: written into the workspace, images and
    # PDFs shown to the model, recorded in the stored prompt (backends/_attachments.py).
    attachments: tuple[str, ...] = ()


class Turn(Protocol):
    """The frames of one turn, in order, ending with `done`.

    The turn runs to its end (and is stored) whatever its reader does: a reader that stops early
    calls `detach()`, after which the remaining frames are only stored, for replay.
    """

    def __aiter__(self) -> AsyncIterator[Frame]: ...

    def detach(self) -> None: ...


@dataclass(frozen=True)
class Files:
    """A session's files: from its live sandbox, or else from its latest snapshot. Close `reader`."""

    source: str  # "sandbox" or "snapshot" (the X-Service-Source header, the listing's `source`)
    reader: FileSource


@dataclass(frozen=True)
class Bundle:
    """A session's workspace as a tar.gz: from its live sandbox, or else its latest snapshot. Close `stream`."""

    source: str  # "sandbox" or "snapshot"
    stream: BinaryIO
    size: int


class SessionBackend(Protocol):
    """Every operation on a session's life that the HTTP layer may ask for.

    Each call checks that the session exists and belongs to `tenant` (NotFound otherwise) and
    raises the ApiError the interface specifies for a refused transition.
    """

    async def create(self, new: NewSession) -> SessionView: ...

    async def view(self, tenant: str, session_id: str) -> SessionView: ...

    async def resume(self, tenant: str, session_id: str) -> SessionView: ...

    async def pause(self, tenant: str, session_id: str) -> SessionView: ...

    async def stop(self, tenant: str, session_id: str) -> SessionView: ...

    async def end(self, tenant: str, session_id: str, *, purge: bool = False) -> SessionView: ...

    async def message(self, tenant: str, session_id: str, message: Message) -> Turn:
        """Start a turn; refusals (not active, a turn already running) are raised before any frame."""
        ...

    async def replay(self, tenant: str, session_id: str, after: int) -> AsyncGenerator[Frame, None]:
        """The stored frames after `after`, then the running turn's as they are stored, until it ends."""
        ...

    async def interrupt(self, tenant: str, session_id: str) -> dict[str, Any]: ...

    async def configure(self, tenant: str, session_id: str, changes: dict[str, Any]) -> SessionView:
        """PATCH .../config: store the changed keys (null clears one); they apply from the next turn.
        410 for an ended session, 409 while it is starting."""
        ...

    async def fork(self, tenant: str, parent_id: str, child_id: str, encrypted_env: bytes | None) -> SessionView:
        """A new session `child_id` with the parent's workspace and conversation (its own environment,
        encrypted for the child's id by the caller)."""
        ...

    async def exec(self, tenant: str, session_id: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
        """Run a program in the session's sandbox for the API client: `{exitCode, stdout, stderr[, timedOut]}`."""
        ...

    async def write_files(self, tenant: str, session_id: str, target: str, files: list[AgentFile]) -> list[str]:
        """Write files into the live workspace; the paths written, relative to the workspace."""
        ...

    async def bundle(self, tenant: str, session_id: str) -> Bundle: ...

    async def restore_bundle(self, tenant: str, session_id: str, data: bytes) -> tuple[int, list[str]]:
        """Unpack a client's tar.gz into the live workspace: how many entries were restored, which skipped."""
        ...

    async def files(self, tenant: str, session_id: str) -> Files: ...

    async def running_turns(self) -> int:
        """How many turns are running (graceful shutdown waits for none)."""
        ...
