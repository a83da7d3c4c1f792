"""Agents: registration by name per tenant, versions, managed folders, encrypted env.

An agent is a folder with `AGENT.md`. It is either a server-side directory named by the client
(`path`, stored as given, resolved) or a folder the server materialises from uploaded `files` and a
`systemPrompt` under `<data dir>/agents/<tenant>/<name>/v<version>/`. Every deploy of a managed
agent writes a new version directory, so a session that is copying the previous version while a new
one is deployed is never disturbed; versions older than the previous one are pruned.

The version counter is advanced in the database, under the row lock of an `UPDATE` (PostgreSQL) or
the writer lock of `BEGIN IMMEDIATE` (SQLite); a concurrent first deploy of one name loses the race
on the unique constraint and retries as an update, so no deploy loses a version.

Blocking file work runs in threads (`asyncio.to_thread`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import shutil
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from sqlalchemy import Table, bindparam, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as SyncSession

from ashd.engines import SETTINGS_FILE, engine_problem, settings_engine
from ashd.errors import BadRequest, NotFound, PayloadTooLarge
from ashd.storage._agent_archive import claim, current_owner, materialise, pack, pack_dir
from ashd.storage._agent_paths import AgentPathPolicy, tenant_dir_name
from ashd.storage._crypto import Cipher
from ashd.storage._database import Database
from ashd.storage._models import Agent, AgentVersion, from_row, iso, new_id, utcnow

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
SYSTEM_PROMPT_FILE = "AGENT.md"
MAX_FILES = 1000
MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_TOTAL_BYTES = 50 * 1024 * 1024
MAX_PATH_CHARS = 1024
MAX_ENV_VARS = 200
MAX_ENV_VALUE_CHARS = 32 * 1024
MASK = "***"
_DEPLOY_ATTEMPTS = 5


@dataclass(frozen=True)
class AgentFile:
    """One file of a materialised agent: a checked relative path and its bytes."""

    path: str
    data: bytes


@dataclass(frozen=True)
class AgentRecord:
    """An agent row as the API shows it; env values are never carried, only their names."""

    id: str
    tenant_id: str
    name: str
    version: int
    path: str
    managed: bool
    model: str | None
    env_names: tuple[str, ...]
    network: bool
    created_at: str | None
    updated_at: str | None
    disk_mb: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "tenantId": self.tenant_id, "version": self.version,
            "path": self.path, "model": self.model, "env": {k: MASK for k in self.env_names},
            "network": self.network, "diskMb": self.disk_mb, "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }


@dataclass(frozen=True)
class AgentView:
    """What session code needs to start a sandbox for an agent (env decrypted)."""

    id: str
    name: str
    version: int
    path: str
    model: str | None
    env: Mapping[str, str]
    network: bool
    disk_mb: int | None = None  # sandbox disk size the agent asks for; None: the server default

    def __repr__(self) -> str:  # env values may be secrets
        return f"AgentView(name={self.name!r}, version={self.version}, path={self.path!r})"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise BadRequest(
            f"agent name {name[:64]!r} is invalid: use 1-255 letters, digits, '_' or '-'"
        )
    return name


def check_env(env: Mapping[str, Any]) -> dict[str, str]:
    if len(env) > MAX_ENV_VARS:
        raise BadRequest(f"`env` has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    for key, value in env.items():
        if not ENV_NAME_RE.match(key):
            raise BadRequest(f"`env` name {key[:64]!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise BadRequest(f"`env.{key}` must be a string")
        if "\x00" in value or len(value) > MAX_ENV_VALUE_CHARS:
            raise BadRequest(f"`env.{key}` must be at most {MAX_ENV_VALUE_CHARS} characters, without NUL")
    return dict(env)


def check_file_path(rel: str) -> str:
    """A path of an uploaded agent file: relative, `/`-separated, no `..`, no NUL. Returns it cleaned."""
    if not rel or len(rel) > MAX_PATH_CHARS:
        raise BadRequest(f"file path must be 1-{MAX_PATH_CHARS} characters")
    if "\x00" in rel:
        raise BadRequest("file path must not contain a NUL character")
    if rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        raise BadRequest(f"file path must be relative, not absolute: {rel!r}")
    parts = rel.replace("\\", "/").split("/")
    if ".." in parts:
        raise BadRequest(f"file path must not contain a '..' segment: {rel!r}")
    cleaned = "/".join(p for p in parts if p not in ("", "."))
    if not cleaned:
        raise BadRequest(f"file path {rel!r} does not name a file")
    return cleaned


def check_files(files: Sequence[AgentFile], max_total: int = MAX_TOTAL_BYTES) -> list[AgentFile]:
    """Paths checked and cleaned; no duplicates, no file used as a directory; sizes bounded."""
    if len(files) > MAX_FILES:
        raise BadRequest(f"`files` has {len(files)} entries; at most {MAX_FILES} are allowed")
    cleaned: dict[str, AgentFile] = {}
    total = 0
    for f in files:
        rel = check_file_path(f.path)
        if rel in cleaned:
            raise BadRequest(f"`files` names {rel!r} twice")
        if len(f.data) > MAX_FILE_BYTES:
            raise PayloadTooLarge(f"file {rel!r} is {len(f.data)} bytes; at most {MAX_FILE_BYTES} per file")
        total += len(f.data)
        cleaned[rel] = AgentFile(rel, f.data)
    if total > max_total:
        raise PayloadTooLarge(f"the uploaded agent holds {total} bytes; at most {max_total} may be uploaded in one "
                              f"deploy (SERVICE_AGENT_MAX_UPLOAD_MB)")
    for rel in cleaned:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in cleaned:
                raise BadRequest(f"{'/'.join(parts[:i])!r} is both a file and the directory of {rel!r}")
    return list(cleaned.values())


def _env_aad(tenant: str, agent_id: str) -> bytes:
    return f"agent-env:{tenant}:{agent_id}".encode()


def _record(row: Agent, env_names: tuple[str, ...]) -> AgentRecord:
    return AgentRecord(
        id=row.id, tenant_id=row.tenant_id, name=row.name, version=row.version, path=row.path,
        managed=row.managed, model=row.model, env_names=env_names, network=row.network,
        created_at=iso(row.created_at), updated_at=iso(row.updated_at), disk_mb=row.disk_mb,
    )


class _Keep:
    """Type of `KEEP`: "leave this field as it is" in `Agents.patch`."""


KEEP = _Keep()


_KNOWN_MAX = 10_000  # agent rows kept by `resolve`
_AGENTS = cast(Table, Agent.__table__)
_AGENT_BY_NAME = select(_AGENTS).where(_AGENTS.c.tenant_id == bindparam("tenant"), _AGENTS.c.name == bindparam("name"))
_AGENT = select(Agent).where(Agent.tenant_id == bindparam("tenant"), Agent.name == bindparam("name"))
_TENANT_AGENTS = select(Agent).where(Agent.tenant_id == bindparam("tenant")).order_by(Agent.name)
_AGENT_ID = select(Agent.id).where(Agent.tenant_id == bindparam("tenant"), Agent.name == bindparam("name"))
_ARCHIVE = select(AgentVersion.archive).where(AgentVersion.agent_id == bindparam("id"),
                                              AgentVersion.version == bindparam("version"))
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _changes_agents(method: Callable[Concatenate[Agents, _P], Awaitable[_R]]
                    ) -> Callable[Concatenate[Agents, _P], Awaitable[_R]]:
    """A method that writes agent rows: what `resolve` knew is forgotten once it is done."""

    @functools.wraps(method)
    async def run(self: Agents, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(self, *args, **kwargs)
        finally:
            self._changed()

    return run


class Agents:
    """The agent repository of one server: database rows plus managed folders under the data dir."""

    def __init__(self, db: Database, cipher: Cipher, data_dir: Path, roots: tuple[Path, ...] = (),
                 max_upload: int = MAX_TOTAL_BYTES, *, sole_writer: bool = False) -> None:
        self._max_upload = max_upload
        self._db = db
        self._cipher = cipher
        self._data_dir = data_dir.resolve()
        self._root = self._data_dir / "agents"
        self.paths = AgentPathPolicy(self._data_dir, roots)
        self._build_lock = asyncio.Lock()
        # Agent rows as `resolve` last read them, by (tenant, name): every create resolves its agent,
        # and the read was a millisecond of it (a reader thread and back). Only for the `sole_writer`
        # of the database (a server on its own SQLite), whose every agent change goes through
        # `_changed` here; on a shared database other processes deploy agents. The folder is still
        # checked at every use.
        self._known: dict[tuple[str, str], tuple[Agent, Mapping[str, str]]] = {}  # the row, its env
        self._cacheable = sole_writer
        self._generation = 0  # bumped after each agent change commits

    def _changed(self) -> None:
        """After an agent change commits (or fails): forget what was known; a resolve reading
        meanwhile sees the generation move and does not keep its answer."""
        self._generation += 1
        self._known.clear()

    # --- reading ---

    def _env(self, row: Agent) -> dict[str, str]:
        value = self._cipher.decrypt_json(row.env_ciphertext, _env_aad(row.tenant_id, row.id))
        return dict(value) if isinstance(value, dict) else {}

    def _to_record(self, row: Agent) -> AgentRecord:
        return _record(row, tuple(sorted(self._env(row))))

    # One trip to a reader thread each (`Database.run_read`), not one per statement through aiosqlite.
    async def _row(self, tenant: str, name: str) -> Agent:
        values = {"tenant": tenant, "name": name}
        row: Agent | None = await self._db.run_read(lambda s: s.execute(_AGENT, values).scalar_one_or_none())
        if row is None:
            raise NotFound(f"Agent {name} not found")
        return row

    async def get(self, tenant: str, name: str) -> AgentRecord:
        return self._to_record(await self._row(tenant, name))

    async def list(self, tenant: str) -> list[AgentRecord]:
        rows = await self._db.run_read(lambda s: s.execute(_TENANT_AGENTS, {"tenant": tenant}).scalars().all())
        return [self._to_record(r) for r in rows]

    async def _checked_path(self, row: Agent) -> Path:
        # A client's folder is checked again at every use: the policy (SERVICE_AGENT_ROOTS) may
        # have changed since the deploy. Server-managed folders are the server's own, built here
        # from the database when this process has no copy yet.
        if row.managed:
            return await self._managed_folder(row)
        return self.paths.recheck(row.path, row.tenant_id, row.name)

    async def _managed_folder(self, row: Agent) -> Path:
        """This process's copy of a managed agent's current version, materialised on first use from
        its archive in the database (deployed by any process)."""
        base = self._root / tenant_dir_name(row.tenant_id) / row.name
        if await asyncio.to_thread(_cached, base, row.version, row.id):
            return base / f"v{row.version}"
        async with self._build_lock:  # one build per process at a time; the next caller finds it built
            version = {"id": row.id, "version": row.version}
            archive = await self._db.run_read(lambda s: s.execute(_ARCHIVE, version).scalar_one_or_none())
            if archive is None:
                raise NotFound(f"The files of agent {row.name} (version {row.version}) are neither in the database "
                               "nor on this server (deployed before agent folders were stored in the database, "
                               "on a server that has not started since); redeploy the agent")
            folder = await asyncio.to_thread(materialise, base, row.version, archive, row.id)
        log.info("built an agent folder from the database", extra={"agent": row.name, "version": row.version})
        return folder

    async def resolve(self, tenant: str, name: str) -> AgentView:
        """The agent as a session starts it (every create): its row and, for a managed folder this
        process already holds, the folder's check in one read (one hop on SQLite); for the sole
        writer, from the row it last read (`_known`)."""

        def held(row: Agent) -> Path | None:
            if not row.managed:
                return None
            base = self._root / tenant_dir_name(row.tenant_id) / row.name
            return base / f"v{row.version}" if _cached(base, row.version, row.id) else None

        known = self._known.get((tenant, name))
        if known is None:
            # One prebuilt statement: on PostgreSQL, where nothing is cached (another coordinator may
            # change the agent), one round trip on the driver rather than an ORM session around it.
            generation = self._generation
            rows = await self._db.read_rows(_AGENT_BY_NAME, {"tenant": tenant, "name": name})
            if not rows:
                raise NotFound(f"Agent {name} not found")
            found = from_row(Agent, rows[0])
            known = (found, MappingProxyType(self._env(found)))
            if self._cacheable and generation == self._generation:
                if len(self._known) >= _KNOWN_MAX:
                    self._known.clear()
                self._known[(tenant, name)] = known
        row, env = known
        folder = held(row)  # a few stats: cheaper than a trip to a thread and back
        path = folder if folder is not None else await self._checked_path(row)
        return AgentView(id=row.id, name=row.name, version=row.version, path=str(path), model=row.model, env=env,
                         network=row.network, disk_mb=row.disk_mb)

    async def folder(self, tenant: str, name: str) -> Path:
        """The agent's directory (canonical), for file listing and reading: open it with
        `_agent_paths.open_dir`, never by following its name."""
        return await self._checked_path(await self._row(tenant, name))

    async def import_local_folders(self) -> int:
        """Managed folders deployed before they were stored in the database (migration 10) are
        packed from this data dir into it, so every other process can build them. Run at start."""
        def managed(s: SyncSession) -> tuple[Sequence[Agent], set[tuple[str, int]]]:
            rows = s.execute(select(Agent).where(Agent.managed.is_(True))).scalars().all()
            return rows, {(a, v) for a, v in s.execute(select(AgentVersion.agent_id, AgentVersion.version)).all()}

        rows, stored = await self._db.run_read(managed)  # one snapshot for both
        imported = 0
        for row in rows:
            folder = Path(row.path)
            if (row.id, row.version) in stored or not await asyncio.to_thread(folder.is_dir):
                continue  # stored already, or deployed on another server: that one imports it
            archive, size = await asyncio.to_thread(pack_dir, folder)
            try:
                async with self._db.tx() as s:
                    s.add(AgentVersion(agent_id=row.id, tenant_id=row.tenant_id, version=row.version,
                                       archive=archive, size_bytes=size))
            except IntegrityError:
                continue  # another process imported it meanwhile
            imported += 1
        if imported:
            log.info("stored managed agent folders of this data dir in the database", extra={"count": imported})
        return imported

    # --- writing ---

    async def deploy(
        self, tenant: str, name: str, *, path: str | None = None, files: Sequence[AgentFile] | None = None,
        system_prompt: str | None = None, model: str | None = None, env: Mapping[str, str] | None = None,
        network: bool | None = None, disk_mb: int | None = None,
    ) -> AgentRecord:
        """Register or redeploy `name` (upsert, version + 1). Exactly one source: `path`, or
        `files`/`system_prompt`. `model`, `env`, `network`, `disk_mb` left as None keep their
        stored values."""
        check_name(name)
        env = check_env(env) if env is not None else None
        if path is not None and (files or system_prompt is not None):
            raise BadRequest("give either `path` or `files`/`systemPrompt`, not both")
        if path is not None:
            folder = await asyncio.to_thread(self.paths.check, path, tenant)
            _check_engine(await asyncio.to_thread(_read_settings, folder))
            return await self._upsert(tenant, name, folder, None, model, env, network, disk_mb)
        if not files and system_prompt is None:
            raise BadRequest("`path` is required (or upload the agent with `files` and/or `systemPrompt`)")
        prompt_bytes = len(system_prompt.encode()) if system_prompt is not None else 0
        checked = check_files(files or [], self._max_upload - prompt_bytes)
        _check_engine(next((f.data for f in checked if f.path == SETTINGS_FILE), None))
        if system_prompt is not None:
            if any(f.path == SYSTEM_PROMPT_FILE for f in checked):
                raise BadRequest(f"give the system prompt either as `systemPrompt` or as a `files` entry "
                                 f"{SYSTEM_PROMPT_FILE}, not both")
            checked.append(AgentFile(SYSTEM_PROMPT_FILE, system_prompt.encode()))
        if not any(f.path == SYSTEM_PROMPT_FILE for f in checked):
            raise BadRequest(f"the agent has no {SYSTEM_PROMPT_FILE}: add `systemPrompt` or a `files` entry "
                             f"{SYSTEM_PROMPT_FILE}")
        base = self._root / tenant_dir_name(tenant) / name
        archive = await asyncio.to_thread(pack, checked)
        staging = await asyncio.to_thread(self._materialise, base, checked)
        try:
            return await self._upsert(tenant, name, None, (base, staging), model, env, network, disk_mb,
                                      (archive, sum(len(f.data) for f in checked)))
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)

    @_changes_agents
    async def patch(
        self, tenant: str, name: str, *, model: str | _Keep | None = KEEP,
        env: Mapping[str, str] | _Keep | None = KEEP, network: bool | _Keep = KEEP,
        disk_mb: int | _Keep | None = KEEP,
    ) -> AgentRecord:
        """Update model/env/network/disk_mb without a new version. Pass `KEEP` for a field to leave
        it; `None` clears model, env or disk_mb."""
        async with self._db.tx() as s:
            row = (await s.execute(
                select(Agent).where(Agent.tenant_id == tenant, Agent.name == name).with_for_update()
            )).scalar_one_or_none()
            if row is None:
                raise NotFound(f"Agent {name} not found")
            if not isinstance(model, _Keep):
                row.model = model
            if not isinstance(env, _Keep):
                row.env_ciphertext = self._encrypt_env(tenant, row.id, check_env(env) if env else None)
            if not isinstance(network, _Keep):
                row.network = network
            if not isinstance(disk_mb, _Keep):
                row.disk_mb = disk_mb
            row.updated_at = utcnow()
            await s.flush()
            return self._to_record(row)

    @_changes_agents
    async def delete(self, tenant: str, name: str) -> None:
        """Remove the registration; sessions stay (they have their own copy in their workspace).
        Server-managed folders of the agent (every version) are removed too; a client's own
        `path` folder never is."""
        async with self._db.tx() as s:
            agent_id = (await s.execute(select(Agent.id).where(Agent.tenant_id == tenant, Agent.name == name))
                        ).scalar_one_or_none()
            result = await s.execute(delete(Agent).where(Agent.tenant_id == tenant, Agent.name == name))
            if result.rowcount == 0 or agent_id is None:  # type: ignore[attr-defined]
                raise NotFound(f"Agent {name} not found")
            await s.execute(delete(AgentVersion).where(AgentVersion.agent_id == agent_id))
        await asyncio.to_thread(shutil.rmtree, self._root / tenant_dir_name(tenant) / name, True)

    # --- internals ---

    def _encrypt_env(self, tenant: str, agent_id: str, env: Mapping[str, str] | None) -> bytes | None:
        if not env:
            return None
        return self._cipher.encrypt_json(dict(env), _env_aad(tenant, agent_id))

    def _materialise(self, base: Path, files: Sequence[AgentFile]) -> Path:
        staging = base / f".staging-{uuid.uuid4().hex}"
        staging.mkdir(parents=True, mode=0o700)
        for f in files:
            target = staging / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.data)
        return staging

    @staticmethod
    def _install(base: Path, staging: Path, version: int, agent_id: str) -> tuple[Path, int]:
        """Move the staged folder to `v<version>` and prune versions older than the previous one.
        Returns the folder and the bytes of the versions kept (what the tenant holds for it)."""
        claim(base, agent_id)
        target = base / f"v{version}"
        if target.exists():  # left by a deploy whose transaction did not commit: the version is ours
            shutil.rmtree(target)
        staging.rename(target)
        kept = 0
        for old in base.glob("v*"):
            if old.name[1:].isdigit() and int(old.name[1:]) < version - 1:
                shutil.rmtree(old, ignore_errors=True)
            elif old.name[1:].isdigit():
                kept += _tree_bytes(old)
        return target, kept

    async def exists(self, tenant: str, name: str) -> bool:
        values = {"tenant": tenant, "name": name}
        return await self._db.run_read(lambda s: s.execute(_AGENT_ID, values).first()) is not None

    @_changes_agents
    async def _upsert(
        self, tenant: str, name: str, folder: Path | None, staged: tuple[Path, Path] | None,
        model: str | None, env: Mapping[str, str] | None, network: bool | None, disk_mb: int | None = None,
        archive: tuple[bytes, int] | None = None,
    ) -> AgentRecord:
        for _ in range(_DEPLOY_ATTEMPTS):
            try:
                return await self._upsert_once(tenant, name, folder, staged, model, env, network, disk_mb, archive)
            except IntegrityError:
                log.debug("concurrent first deploy of agent %s; retrying as an update", name)
        raise BadRequest(f"agent {name} is being deployed concurrently too often; retry")

    async def _upsert_once(
        self, tenant: str, name: str, folder: Path | None, staged: tuple[Path, Path] | None,
        model: str | None, env: Mapping[str, str] | None, network: bool | None, disk_mb: int | None = None,
        archive: tuple[bytes, int] | None = None,
    ) -> AgentRecord:
        now = utcnow()
        async with self._db.tx() as s:
            bumped = (await s.execute(
                update(Agent).where(Agent.tenant_id == tenant, Agent.name == name)
                .values(version=Agent.version + 1, updated_at=now).returning(Agent.id, Agent.version)
            )).first()
            if bumped is None:
                # Claim the name first: a concurrent first deploy fails here (unique constraint) and
                # retries as an update, before any folder has been moved into place.
                s.add(Agent(id=new_id(), tenant_id=tenant, name=name, version=1, path="", managed=False,
                            network=False, created_at=now, updated_at=now))
                await s.flush()
            row = (await s.execute(
                select(Agent).where(Agent.tenant_id == tenant, Agent.name == name)
                .execution_options(populate_existing=True)
            )).scalar_one()
            if archive is not None:
                # The files themselves, for every other process (committed with the version).
                s.add(AgentVersion(agent_id=row.id, tenant_id=tenant, version=row.version, archive=archive[0],
                                   size_bytes=archive[1]))
            await s.execute(delete(AgentVersion).where(AgentVersion.agent_id == row.id,
                                                       AgentVersion.version < row.version - 1))
            if staged is not None:
                target, row.stored_bytes = await asyncio.to_thread(self._install, staged[0], staged[1], row.version,
                                                                   row.id)
                row.path = str(target)
            else:
                assert folder is not None
                row.path = str(folder)
                # The server keeps no copy of a `path` agent; uploads of earlier versions stay
                # until the agent is deleted, and are still held.
                base = self._root / tenant_dir_name(tenant) / name
                row.stored_bytes = await asyncio.to_thread(_tree_bytes, base) if base.is_dir() else 0
            row.managed = staged is not None
            if model is not None:
                row.model = model
            if env is not None:
                row.env_ciphertext = self._encrypt_env(tenant, row.id, env)
            if network is not None:
                row.network = network
            if disk_mb is not None:
                row.disk_mb = disk_mb
            await s.flush()
            return self._to_record(row)


def _cached(base: Path, version: int, agent_id: str) -> bool:
    """This process holds the version: built from the database for this agent, or deployed here
    before folders had owners (no `.agent-id`)."""
    return (base / f"v{version}").is_dir() and current_owner(base) in (agent_id, None)


def _tree_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def _read_settings(folder: Path) -> bytes | None:
    try:
        return (folder / SETTINGS_FILE).read_bytes()
    except OSError:
        return None


def _check_engine(settings: bytes | None) -> None:
    """An agent whose settings.json names an engine this server cannot run is refused at deploy,
    not at its first turn."""
    name = settings_engine(settings)
    if name is None:
        return
    problem = engine_problem(name)
    if problem:
        raise BadRequest(f"{SETTINGS_FILE} `engine`: {problem}")
