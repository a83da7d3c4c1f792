"""`LocalBackend`: sessions that run in this process, on the pool and session actors."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from ashd.actors import CreateRequest, SessionRegistry, TurnTicket, call
from ashd.backends._attachments import WORKSPACE_DIR as ATTACHMENTS_DIR
from ashd.backends._attachments import model_content
from ashd.backends._attachments import prepare as prepare_attachments
from ashd.backends._protocol import Bundle, Files, Frame, Message, NewSession, SessionView, Turn
from ashd.backends._replay import stored_replay
from ashd.backends._stream import TurnStream
from ashd.backends._turn_driver import TurnDriver
from ashd.errors import Conflict, DiskQuotaExceeded, NotFound, SandboxError, ServiceError
from ashd.storage import AgentFile, Attachments, Session, bundle_budget, bundle_workspace, restore_bundle, write_files

log = logging.getLogger(__name__)


class LocalBackend:
    def __init__(self, registry: SessionRegistry, driver: TurnDriver,
                 snapshot_reader: Callable[[str], Awaitable[Any]], bundles: BundleConfig) -> None:
        self._registry = registry
        self._sessions = registry.deps.sessions
        self._attachments = Attachments(self._sessions.db)
        self._driver = driver
        self._snapshot_reader = snapshot_reader  # session id -> SnapshotReader of its latest snapshot, or None
        self._bundles = bundles
        self._turns: set[asyncio.Task[None]] = set()  # running turns, referenced until they finish

    # --- lifecycle -----------------------------------------------------------------------------
    async def create(self, new: NewSession) -> SessionView:
        req = CreateRequest(session_id=new.session_id, tenant=new.tenant, agent_name=new.agent_name,
                            model=new.model, config=new.config, credential_id=new.credential_id, agent=new.agent)
        return await self._registry.create(req, encrypted_env=new.encrypted_env)

    async def view(self, tenant: str, session_id: str) -> SessionView:
        return await self._registry.view(tenant, session_id)

    async def resume(self, tenant: str, session_id: str) -> SessionView:
        return await self._registry.resume(tenant, session_id)

    async def pause(self, tenant: str, session_id: str) -> SessionView:
        return await self._registry.pause(tenant, session_id)

    async def stop(self, tenant: str, session_id: str) -> SessionView:
        return await self._registry.stop(tenant, session_id)

    async def end(self, tenant: str, session_id: str, *, purge: bool = False) -> SessionView:
        return await self._registry.delete(tenant, session_id, purge=purge)

    async def interrupt(self, tenant: str, session_id: str) -> dict[str, Any]:
        return await self._registry.interrupt(tenant, session_id)

    async def configure(self, tenant: str, session_id: str, changes: dict[str, Any]) -> SessionView:
        return await self._registry.configure(tenant, session_id, changes)

    async def fork(self, tenant: str, parent_id: str, child_id: str, encrypted_env: bytes | None) -> SessionView:
        return await self._registry.fork(tenant, parent_id, child_id, encrypted_env)

    async def exec(self, tenant: str, session_id: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
        return await self._registry.exec(tenant, session_id, argv, timeout_s)

    async def write_files(self, tenant: str, session_id: str, target: str, files: list[AgentFile]) -> list[str]:
        return await self._registry.write_files(tenant, session_id, target, files)

    async def bundle(self, tenant: str, session_id: str) -> Bundle:
        workspace = await self._registry.workspace(tenant, session_id)  # 404 for unknown or other tenant
        if workspace is not None and Path(workspace).is_dir():
            stream = await asyncio.to_thread(_bundle_live, Path(workspace), self._bundles.spool_dir, session_id,
                                             self._bundles.max_bytes)
            source = "sandbox"
        else:
            info = await self._bundles.latest_snapshot(session_id)
            if info is None:
                raise NotFound(f"No workspace available for session {session_id}: it has no live sandbox and "
                               "no snapshot")
            stream = await asyncio.to_thread(open, info.path, "rb")
            source = "snapshot"
        return Bundle(source, stream, os.fstat(stream.fileno()).st_size)

    async def restore_bundle(self, tenant: str, session_id: str, data: bytes) -> tuple[int, list[str]]:
        def restore(workspace: Path, owner: tuple[int, int] | None) -> tuple[int, list[str]]:
            try:
                outcome = restore_bundle(data, workspace, owner)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the sandbox's own disk quota
                    raise DiskQuotaExceeded("the session's workspace disk is full; the bundle was restored in "
                                            "part. Remove files or create the session with a larger `diskMb`") from exc
                raise SandboxError(f"the bundle could not be restored: {exc}") from exc
            return len(outcome.restored), outcome.skipped

        return await self._registry.in_live_workspace(tenant, session_id, "restoring a workspace bundle", restore)

    # --- turns ---------------------------------------------------------------------------------
    async def message(self, tenant: str, session_id: str, message: Message) -> Turn:
        t0 = time.monotonic()
        stored = message.content
        records: list[dict[str, Any]] = []
        if message.attachments:
            message, records = await self._attach(tenant, session_id, message)
        ticket = await self._registry.begin_turn(tenant, session_id, stored, message.model, records,
                                                 self._driver.send_query(message))
        lookup_ms = (time.monotonic() - t0) * 1000
        stream = TurnStream()
        # The turn runs in its own task: a reader that goes away (the server may cancel its
        # handler then) must not stop it; it finishes and is stored, and can be replayed.
        task = asyncio.get_running_loop().create_task(self._drive(ticket, message, stream, lookup_ms))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)
        # One step of the turn's task now: it writes the query to the bridge and waits for its first
        # frame, so the sandbox works on the turn while the caller sends the stream's headers.
        await asyncio.sleep(0)
        return stream

    async def _attach(self, tenant: str, session_id: str, message: Message) -> tuple[Message, list[dict[str, Any]]]:
        """Write the attachments the message names into the workspace; the message as the model gets
        it, and what the stored prompt records. Refusals come before anything is written."""
        await self._sessions.get(tenant, session_id)  # 404 for unknown or other tenant, before the ids
        items = await self._attachments.for_message(tenant, session_id, message.attachments)
        if await self._registry.running_turn(tenant, session_id) is not None:
            raise Conflict("A turn is already running")
        files, records = prepare_attachments(items)
        await self._registry.in_live_workspace(
            tenant, session_id, "sending a message with attachments",
            lambda ws, owner: write_files(ws, ATTACHMENTS_DIR, files, owner))
        return replace(message, content=model_content(message.content, items, records)), records

    async def _drive(self, ticket: TurnTicket, message: Message, stream: TurnStream, lookup_ms: float) -> None:
        error: BaseException | None = None
        told = False

        async def ended(ticket: TurnTicket, row: Session | None) -> None:
            nonlocal told
            await self._registry.end_turn_now(ticket, row)
            told = True

        try:
            await self._driver.run(ticket, message, stream, lookup_ms, ended=ended)
        except Exception as exc:
            log.exception("a turn failed", extra={"sessionId": ticket.session_id})
            error = exc
        finally:
            if not told:  # the turn failed before its end was told: the session's actor hears it now
                self._registry.end_turn(ticket)
            stream.end(error)

    async def replay(self, tenant: str, session_id: str, after: int) -> AsyncGenerator[Frame, None]:
        async def running() -> bool:  # this process runs the session's turns: its actor knows
            return await self._registry.running_turn(tenant, session_id) is not None

        return await stored_replay(self._sessions, tenant, session_id, after, running)

    async def running_turns(self) -> int:
        return await self._registry.running_count()

    # --- files ---------------------------------------------------------------------------------
    async def files(self, tenant: str, session_id: str) -> Files:
        from ashd.storage import DirectoryReader

        workspace = await self._registry.workspace(tenant, session_id)  # 404 for unknown or other tenant
        if workspace is not None and Path(workspace).is_dir():
            return Files("sandbox", DirectoryReader(Path(workspace)))
        reader = await self._snapshot_reader(session_id)
        if reader is not None:
            return Files("snapshot", reader)
        raise NotFound(f"No workspace available for session {session_id}: it has no live sandbox and no snapshot")

    async def pause_all(self) -> int:
        """Pause every active session of this process and wait for their workspace snapshots: a
        runner that stops for good leaves its sessions resumable elsewhere (with SERVICE_SNAPSHOT_URL,
        with their files). How many were paused."""
        paused = 0
        for tenant, session_id in self._registry.live_sessions():
            try:
                view = await self._registry.view(tenant, session_id)
                if view.get("status") != "active":
                    continue
                await self._registry.pause(tenant, session_id)
                await self._bundles.latest_snapshot(session_id)  # queued after its snapshot: waits for it
                paused += 1
            except ServiceError as exc:
                log.warning("could not pause a session before stopping: %s", exc.message,
                            extra={"sessionId": session_id})
        return paused

    async def close(self) -> None:
        """Stop the session actors (their sandboxes go with the pool, stopped after this)."""
        await self._registry.stop_all()


@dataclass(frozen=True)
class BundleConfig:
    spool_dir: Path  # where a live workspace's bundle is built (on the data disk, unlinked)
    max_bytes: int  # the snapshot limit: a bundle is no larger than a snapshot may be
    latest_snapshot: Callable[[str], Awaitable[Any]]  # session id -> SnapshotInfo of its latest snapshot, or None


def _bundle_live(workspace: Path, spool_dir: Path, session_id: str, max_bytes: int) -> BinaryIO:
    out = tempfile.TemporaryFile(dir=spool_dir)  # noqa: SIM115 - returned open; on the data disk, unlinked
    try:
        bundle_workspace(workspace, out, bundle_budget(session_id, max_bytes))
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


def latest_snapshot(snapshots: Any, timeout: float) -> Callable[[str], Awaitable[Any]]:
    async def latest(session_id: str) -> Any:
        return None if snapshots is None else await call(snapshots.latest(session_id), timeout)

    return latest


def snapshot_reader(snapshots: Any, timeout: float) -> Callable[[str], Awaitable[Any]]:
    async def read(session_id: str) -> Any:
        return None if snapshots is None else await call(snapshots.reader(session_id), timeout)

    return read
