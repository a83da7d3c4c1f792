"""Managed agent folders as gzip tars in the database, and their materialised copies on disk.

A deploy stores its files as one `agent_versions` row; any process (another coordinator, a runner)
builds the folder from it into its own `<data dir>/agents/<tenant>/<name>/v<version>/` the first time
it needs it: extracted into a staging directory next to it, then renamed into place, so a folder
that exists is always whole. `<name>/.agent-id` names the agent the cached versions belong to: an
agent deleted and deployed again under the same name elsewhere starts at version 1 again, and the
old copies are dropped instead of served.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ashd.storage._untar import extract

AGENT_ID_FILE = ".agent-id"
_MTIME = 0  # archives of the same files are the same bytes


class _File(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def data(self) -> bytes: ...


def pack(files: Sequence[_File]) -> bytes:
    """A gzip tar of checked agent files (regular files, mode 0644)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=_MTIME, compresslevel=1) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.size = len(f.data)
            info.mode = 0o644
            info.mtime = _MTIME
            tar.addfile(info, io.BytesIO(f.data))
    return raw.getvalue()


def pack_dir(folder: Path) -> tuple[bytes, int]:
    """A folder deployed before archives existed: its regular files (links and others skipped, as an
    upload never makes them) packed like a deploy; returns the archive and the files' bytes."""

    class _Read:
        def __init__(self, path: str, data: bytes) -> None:
            self.path = path
            self.data = data

    files: list[_Read] = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files.append(_Read(path.relative_to(folder).as_posix(), path.read_bytes()))
    return pack(files), sum(len(f.data) for f in files)


def current_owner(base: Path) -> str | None:
    try:
        return (base / AGENT_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def claim(base: Path, agent_id: str) -> None:
    """Make `base` the cache of agent `agent_id`: versions of another agent of the same name go
    (folders from before owners were written, without `.agent-id`, are this agent's own deploys)."""
    owner = current_owner(base)
    if owner == agent_id:
        return
    if owner is not None and base.exists():
        for old in base.iterdir():
            if old.name.startswith("v") and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = base / f".agent-id.{uuid.uuid4().hex}"
    tmp.write_text(agent_id + "\n")
    os.replace(tmp, base / AGENT_ID_FILE)


def materialise(base: Path, version: int, archive: bytes, agent_id: str) -> Path:
    """Build `base/v<version>` from `archive` unless it is there; returns it. Blocking: call in a thread."""
    claim(base, agent_id)
    target = base / f"v{version}"
    if target.is_dir():
        return target
    staging = base / f".staging-{uuid.uuid4().hex}"
    staging.mkdir(mode=0o700)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(archive)) as gz, tarfile.open(fileobj=gz, mode="r") as tar:
            outcome = extract(tar, staging, lambda _rel: True)
        if outcome.skipped:  # archives are built from checked uploads: a skip is damage, not policy
            raise OSError(f"agent archive v{version} did not extract whole: {outcome.skipped[:3]}")
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # not a concurrent build that won: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in base.glob("v*"):  # like a deploy: keep this version and the previous one
        if old.name[1:].isdigit() and int(old.name[1:]) < version - 1:
            shutil.rmtree(old, ignore_errors=True)
    return target
