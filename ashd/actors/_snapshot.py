"""SnapshotActor: takes, finds, restores and deletes workspace snapshots, off the request path.

One per server. The tar work runs in this actor's thread (that is what it is for), so an ask may
wait behind another session's snapshot: callers ask with a timeout. From asyncio:

    proxy = snapshot_proxy(ref)
    info = await call(proxy.snapshot(session_id, workspace), timeout)   # ashd.actors._aio.call
    reader = await call(proxy.reader(session_id), timeout)
    files = await loop.run_in_executor(None, reader.list_files)         # reading is the caller's

Local snapshots (`<data dir>/snapshots/<session id>/`) are always written first. With a remote
store (`SERVICE_SNAPSHOT_URL`) each snapshot is then uploaded; a failed upload is logged at
WARNING, the local snapshot stays, and the upload is retried every `retry_seconds` until it works
or a newer snapshot of that session has been uploaded.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pykka
from pykka.typing import ActorMemberMixin, proxy_method

from ashd.actors._aio import AioActor
from ashd.actors._owed import Owed, OwedSnapshots, TakeOwed
from ashd.actors._room import RoomWatch
from ashd.errors import ServiceError, StorageFull
from ashd.storage import (
    DEFAULT_KEEP,
    PARTIAL_PREFIX,
    SETTLE_NS,
    LocalSnapshotStore,
    SnapshotBoard,
    SnapshotInfo,
    SnapshotReader,
    SnapshotStore,
    info_for,
    is_no_space,
    latest_local,
    prune,
    remove_stale_partials,
    restore_workspace,
    settle_ns_for,
    snapshot_workspace,
    workspace_fingerprint,
)

log = logging.getLogger(__name__)
FINGERPRINTS_KEPT = 4096  # about 100 bytes each


@dataclass(frozen=True)
class _RetryUploads:
    """Sent by the retry timer; handled in the actor thread like any message."""


class SnapshotActor(AioActor):
    def __init__(
        self,
        snapshots_dir: Path,
        remote: SnapshotStore | None = None,
        *,
        keep: int = DEFAULT_KEEP,
        retry_seconds: float = 60.0,
        max_bytes: int | None = None,
        board: SnapshotBoard | None = None,
        owed: OwedSnapshots | None = None,
    ) -> None:
        super().__init__()
        self.local = LocalSnapshotStore(snapshots_dir, keep)
        self.max_bytes = max_bytes
        self.board = board or SnapshotBoard()
        self.remote = remote
        self.retry_seconds = retry_seconds
        self._pending: dict[str, str] = {}  # session id -> key whose upload failed
        # session id -> (its workspace's fingerprint, the key of the snapshot taken of that tree)
        self._fingerprints: dict[str, tuple[bytes, str]] = {}
        self._settle_ns = SETTLE_NS
        self._timer: threading.Timer | None = None
        # Snapshots that can wait for a quiet moment, by session (`snapshot_soon`, `_owed.py`).
        self.owed = owed or OwedSnapshots(None)  # without an Activity: taken at once
        # A snapshot owed on a full disk is taken again as soon as there is room (`_room.py`).
        self._room = RoomWatch(self.local.root, self._on_room)

    def on_start(self) -> None:
        self.owed.attach(self.actor_ref)
        # One actor per data dir: any partial file left there is a crashed writer's.
        self.local.root.mkdir(parents=True, exist_ok=True)
        self._settle_ns = settle_ns_for(self.local.root)
        for entry in os.scandir(self.local.root):
            if entry.is_dir(follow_symlinks=False):
                remove_stale_partials(Path(entry.path), older_than=0)
                self.board.refresh(entry.name, Path(entry.path))

    def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._room.stop()
        self.owed.stop()
        self.take_owed()  # a server that stops still stores what its pauses promised

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _RetryUploads):
            return self.retry_uploads()
        if isinstance(message, TakeOwed):
            return self.take_owed()
        return super().on_receive(message)

    def snapshot_soon(self, session_id: str, workspace: Path,
                      taken: concurrent.futures.Future[Any] | None = None) -> None:
        """Snapshot `workspace` once no request has been in flight for a moment (`Activity`; at most
        0.1 s later), or before any other request about this session, whichever comes first: a
        pause's snapshot, or a DELETE's final one, after their answers. The tar work would otherwise
        take the interpreter from the requests that follow (docs/performance.md, sixth pass). The
        session actors add to `owed` directly, which is the same without a message to this actor.

        `taken` is resolved once the snapshot is stored, or with the error that stopped it: the
        sandbox that holds the workspace goes only then. A full data disk keeps it owed, retried
        as soon as the disk has room again (`_room.py`), and every `retry_seconds` besides (and by a
        restart's rescue of the workspace), until it is stored. Failures are logged, as nobody waits for the outcome."""
        self.owed.add(session_id, workspace, taken, tell=False)
        if not self.owed.waits:
            self._settle(session_id)

    def take_owed(self) -> int:
        """Take every owed snapshot now (a server that stops, before its sandboxes go); how many
        are still owed (a full disk)."""
        for session_id in self.owed.sessions():
            self._settle(session_id)
        return len(self.owed.sessions())

    def _settle(self, session_id: str) -> None:
        """Take the snapshot owed for `session_id` now, if any; a failure is logged."""
        owed = self.owed.pop(session_id)
        if owed is None:
            return
        workspace, waiting = owed
        try:
            self.snapshot(session_id, workspace, waiting)
        except StorageFull:
            if waiting:  # the sandbox waits for it: lose nothing, try again once there is room
                self._owed_again(session_id, owed)
        except ServiceError:
            pass  # logged by `snapshot`
        except Exception:
            log.exception("snapshot failed", extra={"session_id": session_id})

    def snapshot(self, session_id: str, workspace: Path,
                 waiting: list[concurrent.futures.Future[Any]] | None = None) -> SnapshotInfo:
        """Snapshot `workspace` now; upload it if a remote store is set. Returns the local one.
        SnapshotTooLarge (413) or StorageFull (507) when it cannot be stored; the previous stays.
        What waited for an owed snapshot of the session is told the outcome of this one (newer)."""
        owed = self.owed.pop(session_id)
        waiting = (waiting or []) + (owed[1] if owed is not None else [])
        try:
            info = self._snapshot(session_id, workspace)
        except StorageFull:
            if owed is not None and owed[1]:  # still owed to those that wait (see `snapshot_soon`)
                self._owed_again(session_id, owed)
            raise
        except BaseException as exc:
            _tell(waiting, None, exc)
            raise
        _tell(waiting, info, None)
        return info

    def _snapshot(self, session_id: str, workspace: Path) -> SnapshotInfo:
        directory = self.local.session_dir(session_id)
        fingerprint = workspace_fingerprint(workspace, self._settle_ns)
        known = self._fingerprints.pop(session_id, None)
        if fingerprint is not None and known is not None and known[0] == fingerprint:
            latest = latest_local(directory, session_id)
            if latest is not None and latest.key == known[1]:  # the tree is as that snapshot holds it
                self._remember(session_id, known)
                return latest
        try:
            info = snapshot_workspace(workspace, directory, session_id, keep=self.local.keep,
                                      max_bytes=self.max_bytes)
        except ServiceError as exc:
            # Said here too: pause asks for its snapshot without waiting for the answer.
            log.warning("snapshot not taken: %s", exc.message, extra={"session_id": session_id})
            raise
        finally:
            self.board.refresh(session_id, directory)
        if fingerprint is not None:  # taken before the tar: a change made during it shows next time
            self._remember(session_id, (fingerprint, info.key))
        if self.remote is not None:
            self._upload(session_id, info)
        return info

    def _remember(self, session_id: str, fingerprint: tuple[bytes, str]) -> None:
        """Keep the fingerprints of the most recently snapshotted sessions only: an ended session's
        would otherwise stay forever. A forgotten one costs one snapshot more, never a wrong one."""
        self._fingerprints[session_id] = fingerprint  # popped before: now the newest in the dict
        if len(self._fingerprints) > FINGERPRINTS_KEPT:
            del self._fingerprints[next(iter(self._fingerprints))]

    def copy_latest(self, from_session: str, to_session: str) -> bool:
        """Give `to_session` a copy of `from_session`'s newest snapshot (a fork of a session without a
        live sandbox); False when it has none. Uploaded like any snapshot when a remote store is set."""
        info = self.latest(from_session)
        if info is None:
            return False
        directory = self.local.session_dir(to_session)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / info.path.name
        partial = directory / f"{PARTIAL_PREFIX}{info.path.name}"  # swept if this copy dies half way
        try:
            shutil.copyfile(info.path, partial)
            os.replace(partial, target)  # whole or not at all, as every snapshot file
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            if is_no_space(exc):
                raise StorageFull("The server's data disk is full: the snapshot could not be copied for the "
                                  "fork. Nothing was changed; retry once space is freed") from exc
            raise
        self.board.refresh(to_session, directory)
        copied = info_for(to_session, target)
        if self.remote is not None:
            self._upload(to_session, copied)
        return True

    def latest(self, session_id: str) -> SnapshotInfo | None:
        """The newest snapshot of the session, as a local file.

        Local first; with a remote store, one listing also checks whether another runner stored a
        newer one (the session may have run elsewhere since), which is then downloaded into the
        local cache. A remote that cannot be reached leaves the local answer, with a WARNING.
        """
        self._settle(session_id)  # an owed snapshot is the newest: reads see it, restores restore it
        directory = self.local.session_dir(session_id)
        local = latest_local(directory, session_id)
        if self.remote is None:
            return local
        try:
            key = self.remote.latest(session_id)
            if key is None or (local is not None and key <= local.key):
                return local
            self.remote.get(session_id, key, directory / key)
        except (ServiceError, OSError) as exc:
            log.warning("remote snapshot store unavailable, using the local snapshot",
                        extra={"session_id": session_id, "store": self.remote.description,
                               "error": str(exc)})
            return local
        prune(directory, self.local.keep)
        self.board.refresh(session_id, directory)
        return info_for(session_id, directory / key)

    def restore(self, session_id: str, dest: Path) -> bool:
        """Restore the newest snapshot into `dest`; False when the session has none."""
        info = self.latest(session_id)
        if info is None:
            return False
        restore_workspace(info, dest)
        return True

    def reader(self, session_id: str) -> SnapshotReader | None:
        """A reader on the newest snapshot (the caller reads it in an executor and closes it)."""
        info = self.latest(session_id)
        return SnapshotReader(info.path) if info is not None else None

    def delete(self, session_id: str) -> None:
        """Forget every snapshot of the session, local and remote (what waited for an owed one is
        told there is none)."""
        owed = self.owed.pop(session_id)
        _tell(owed[1] if owed is not None else [], None, None)
        self._pending.pop(session_id, None)
        self._fingerprints.pop(session_id, None)
        self.local.delete_session(session_id)
        self.board.forget(session_id)
        if self.remote is not None:
            try:
                self.remote.delete_session(session_id)
            except (ServiceError, OSError) as exc:
                log.warning("could not delete remote snapshots",
                            extra={"session_id": session_id, "store": self.remote.description,
                                   "error": str(exc)})

    def pending_uploads(self) -> dict[str, str]:
        """Sessions whose newest snapshot is not uploaded yet (session id -> key)."""
        return dict(self._pending)

    def retry_uploads(self) -> int:
        """Upload each pending session's newest local snapshot, and take the owed snapshots a full
        disk refused; return how many uploads are still pending."""
        self._timer = None
        self.take_owed()
        for session_id in list(self._pending):
            info = latest_local(self.local.session_dir(session_id), session_id)
            if info is None:
                self._pending.pop(session_id, None)
            else:
                self._upload(session_id, info)
        return len(self._pending)

    def _upload(self, session_id: str, info: SnapshotInfo) -> None:
        assert self.remote is not None
        try:
            self.remote.put(session_id, info.path)
        except (ServiceError, OSError) as exc:
            log.warning("snapshot upload failed; kept locally, will retry",
                        extra={"session_id": session_id, "key": info.key,
                               "store": self.remote.description, "error": str(exc)})
            self._pending[session_id] = info.key
            self._schedule_retry()
            return
        if self._pending.get(session_id, "") <= info.key:
            self._pending.pop(session_id, None)

    def _owed_again(self, session_id: str, owed: Owed) -> None:
        """A full disk refused an owed snapshot: owed still, taken again when the disk has room (or
        on the retry timer, for room that `statvfs` does not show: a quota)."""
        self.owed.put_back(session_id, owed)
        self._room.watch()
        self._schedule_retry()

    def _on_room(self) -> None:  # on the room watch's thread
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(TakeOwed())

    def _schedule_retry(self) -> None:
        if self._timer is not None:
            return
        ref = self.actor_ref

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_RetryUploads())

        self._timer = threading.Timer(self.retry_seconds, fire)
        self._timer.daemon = True
        self._timer.start()


def _tell(waiting: list[concurrent.futures.Future[Any]], info: SnapshotInfo | None,
          error: BaseException | None) -> None:
    for future in waiting:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(info)


class SnapshotProxy(ActorMemberMixin, pykka.ActorProxy[SnapshotActor]):
    """Typed proxy: every method returns a future; await it with `ashd.actors._aio.call`."""

    snapshot = proxy_method(SnapshotActor.snapshot)
    snapshot_soon = proxy_method(SnapshotActor.snapshot_soon)
    take_owed = proxy_method(SnapshotActor.take_owed)
    latest = proxy_method(SnapshotActor.latest)
    copy_latest = proxy_method(SnapshotActor.copy_latest)
    restore = proxy_method(SnapshotActor.restore)
    reader = proxy_method(SnapshotActor.reader)
    delete = proxy_method(SnapshotActor.delete)
    pending_uploads = proxy_method(SnapshotActor.pending_uploads)
    retry_uploads = proxy_method(SnapshotActor.retry_uploads)


def snapshot_proxy(ref: pykka.ActorRef[SnapshotActor]) -> SnapshotProxy:
    return cast(SnapshotProxy, ref.proxy())
