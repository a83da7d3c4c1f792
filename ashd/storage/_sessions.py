"""Session rows, lifecycle transitions with their events, messages and stored stream frames."""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Insert,
    Integer,
    Row,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as SyncSession

from ashd.errors import Conflict, NotFound
from ashd.storage._database import Database
from ashd.storage._direct import Statements, with_defaults
from ashd.storage._model_calls import ModelCallRecord, insert_model_calls
from ashd.storage._models import Agent, Attachment, Message, Session, SessionEvent, from_row, iso, new_id, utcnow
from ashd.storage._sequence import allocate, allocate_sync
from ashd.storage._usage import INSERT_USAGE, TurnUsage, usage_rows

_SESSIONS = cast(Table, Session.__table__)
_EVENTS = cast(Table, SessionEvent.__table__)
_AGENTS = cast(Table, Agent.__table__)
_MESSAGES = cast(Table, Message.__table__)
# Reads built once, run with their values bound.
_GET = select(Session).where(Session.id == bindparam("id"), Session.tenant_id == bindparam("tenant"))
_ROW_ANY = select(_SESSIONS).where(_SESSIONS.c.id == bindparam("id"))
_ROW = _ROW_ANY.where(_SESSIONS.c.tenant_id == bindparam("tenant"))
LIST_LIMIT = 1000  # the most sessions `GET /api/sessions` returns, newest first
# What `session_json` reads of a row, and no more: the list returns up to LIST_LIMIT of them.
_LISTED = (select(*(_SESSIONS.c[name] for name in (
    "id", "tenant_id", "agent_name", "sandbox_id", "status", "model", "runner_id", "parent_session_id",
    "created_at", "last_active_at", "config", "credential_id", "env_ciphertext", "error")))
    .where(_SESSIONS.c.tenant_id == bindparam("tenant"))
    .order_by(_SESSIONS.c.created_at.desc()).limit(bindparam("limit")))
_LISTED_BY_AGENT = _LISTED.where(_SESSIONS.c.agent_name == bindparam("agent"))
_MESSAGE_CONTENTS = (select(Message.content).where(Message.session_id == bindparam("id"))
                     .order_by(Message.sequence))
_MESSAGES_AFTER = (select(Message.id, Message.session_id, Message.tenant_id, Message.role, Message.content,
                          Message.sequence, Message.created_at)
                   .where(Message.session_id == bindparam("id"), Message.tenant_id == bindparam("tenant"),
                          Message.sequence > bindparam("after"))
                   .order_by(Message.sequence).limit(bindparam("limit", type_=Integer)))


def _events_after(of_type: bool) -> Select[str, str, str, str, str | None, int, datetime]:
    e = SessionEvent
    # Rows of type "frame" only carry stream frames for replay: dropped here, before the limit, so
    # `after=7&limit=1` still finds the next event that a client can see. `compaction` is ashd's own
    # type: the reference's clients check each event's type against their list (ash-ai-sdk's
    # SessionEvent raises on it), so it is listed only when asked for.
    return (select(e.id, e.session_id, e.tenant_id, e.type, e.data, e.sequence, e.created_at)
            .where(e.session_id == bindparam("id"), e.tenant_id == bindparam("tenant"),
                   e.sequence > bindparam("after"), e.type != "frame",
                   e.type == bindparam("type") if of_type else e.type != "compaction")
            .order_by(e.sequence).limit(bindparam("limit", type_=Integer)))


_EVENTS_AFTER, _EVENTS_OF_TYPE = _events_after(False), _events_after(True)
_FRAMES_AFTER = (select(SessionEvent.sequence, SessionEvent.frame_event, SessionEvent.frame_data)
                 .where(SessionEvent.session_id == bindparam("id"), SessionEvent.sequence > bindparam("after"),
                        SessionEvent.frame_event.is_not(None))
                 .order_by(SessionEvent.sequence).limit(bindparam("limit", type_=Integer)))
# A turn's last batch of at most this many rows is stored on the loop, unless the database is busy
# (`store_turn_batch`): measured at 1.1-1.3 ms for about twenty rows (0.4 ms of it building them
# before SQLite runs), so the loop is held for a few milliseconds at most.
INLINE_BATCH_ROWS = 40

# Statuses in which a session is held by the runner its row names (its sandbox lives there).
LIVE_STATUSES = ("active", "starting")


@functools.lru_cache(maxsize=64)
def _transition_update(columns: tuple[str, ...], fenced: bool, agent_checked: bool = False) -> Update:
    """A transition's UPDATE, built once per set of columns it sets: building and coercing the
    statement, and its cache key, cost more than SQLite takes to run it (docs/performance.md).
    `agent_checked`: it changes nothing unless the session's agent exists (a warm resume's check,
    in the same statement rather than one of its own before it)."""
    c = _SESSIONS.c
    statement = update(_SESSIONS).where(c.id == bindparam("_id"))
    if agent_checked:
        statement = statement.where(exists().where(_AGENTS.c.tenant_id == bindparam("_tenant"),
                                                   _AGENTS.c.name == bindparam("_agent")))
    if fenced:  # the statuses as literals, not an IN list: one SQL string, compiled once (`_direct.py`)
        statement = statement.where(or_(c.runner_id == bindparam("_fence"), c.runner_id.is_(None),
                                        and_(*(c.status != status for status in LIVE_STATUSES))))
    return statement.values(
        status=bindparam("_status"), updated_at=bindparam("_now", type_=c.updated_at.type),
        next_event_seq=c.next_event_seq + 1, event_count=c.event_count + 1,
        stored_bytes=c.stored_bytes + bindparam("_size"),
        **{name: bindparam(f"_v_{name}", type_=c[name].type) for name in columns},
    ).returning(*c)


@functools.lru_cache(maxsize=64)
def _transition_with_event(columns: tuple[str, ...], fenced: bool, agent_checked: bool = False) -> Select[Any]:
    """The transition's UPDATE and its event's INSERT as one statement (PostgreSQL's data-modifying
    CTE): atomic by itself, so it runs without BEGIN and COMMIT, two round trips of four fewer. The
    event goes in only if the row changed, numbered from the row's new `next_event_seq`; the
    statement returns the row as the UPDATE does."""
    changed = _transition_update(columns, fenced, agent_checked).cte("changed")
    e = _EVENTS.c
    event = insert(_EVENTS).from_select(
        [e.id, e.session_id, e.tenant_id, e.type, e.data, e.sequence, e.created_at],
        select(bindparam("_event_id", type_=e.id.type), changed.c.id, changed.c.tenant_id, literal("lifecycle"),
               bindparam("_data", type_=e.data.type), changed.c.next_event_seq,
               bindparam("_event_at", type_=e.created_at.type)),
    ).cte("event")
    return select(changed).add_cte(event)


@functools.lru_cache(maxsize=2)
def _turn_batch_update(closing: bool) -> Update:
    """A turn batch's UPDATE: the counts, the messages' sequences, and with `closing` (the batch holds
    `done`) the turn's end."""
    c = _SESSIONS.c
    values: dict[str, Any] = {
        "last_active_at": bindparam("_now", type_=c.last_active_at.type),
        "message_count": c.message_count + bindparam("_messages"),
        "next_message_seq": c.next_message_seq + bindparam("_messages"),
        "event_count": c.event_count + bindparam("_events"), "stored_bytes": c.stored_bytes + bindparam("_size"),
    }
    if closing:  # the row as the turn leaves it: its session's actor keeps it (`SessionActor.end_turn`)
        values["turn_open"] = False
        return update(_SESSIONS).where(c.id == bindparam("_id")).values(**values).returning(*c)
    return update(_SESSIONS).where(c.id == bindparam("_id")).values(**values).returning(c.next_message_seq)


_SESSION_HOLDER = select(_SESSIONS.c.runner_id).where(_SESSIONS.c.id == bindparam("_id"))
_AGENT_EXISTS = select(_AGENTS.c.id).where(_AGENTS.c.tenant_id == bindparam("_tenant"),
                                           _AGENTS.c.name == bindparam("_agent"))
_INSERT_EVENT: Insert = insert(_EVENTS)
_INSERT_SESSION: Insert = insert(_SESSIONS)
_INSERT_MESSAGE: Insert = insert(_MESSAGES)
# An attachment named by a prompt, linked to its message unless an earlier one has it.
_LINK_ATTACHMENT: Update = update(Attachment).where(
    Attachment.id == bindparam("_id"), Attachment.session_id == bindparam("_session"),
    Attachment.message_id.is_(None)).values(message_id=bindparam("_message"))
# A user message: count it, allocate its sequence and open the turn, in one statement built once.
_USER_MESSAGE_UPDATE: Update = update(_SESSIONS).where(_SESSIONS.c.id == bindparam("_id")).values(
    next_message_seq=_SESSIONS.c.next_message_seq + 1,
    last_active_at=bindparam("_now", type_=_SESSIONS.c.last_active_at.type), turn_open=True,
    message_count=_SESSIONS.c.message_count + 1, stored_bytes=_SESSIONS.c.stored_bytes + bindparam("_size"),
    next_event_seq=_SESSIONS.c.next_event_seq + bindparam("_events"),
).returning(_SESSIONS.c.next_message_seq, _SESSIONS.c.next_event_seq)

_counted = _USER_MESSAGE_UPDATE.cte("counted")
# The same and the message's INSERT as one statement, for PostgreSQL (`_transition_with_event`).
_USER_MESSAGE_WITH_INSERT: Select[Any] = select(_counted).add_cte(insert(_MESSAGES).from_select(
    ["id", "session_id", "tenant_id", "role", "content", "sequence", "created_at"],
    select(bindparam("_message_id", type_=_MESSAGES.c.id.type), bindparam("_id", type_=_MESSAGES.c.session_id.type),
           bindparam("_tenant", type_=_MESSAGES.c.tenant_id.type), literal("user"),
           bindparam("_body", type_=_MESSAGES.c.content.type), _counted.c.next_message_seq,
           bindparam("_created_at", type_=_MESSAGES.c.created_at.type))).cte("stored"))


class SessionHeldElsewhere(Conflict):
    """A runner wrote to a session that another runner now holds live: the writer's copy is stale
    (it was thought dead meanwhile, and the session was resumed elsewhere)."""


_SECRET_HINTS = ("key", "token", "secret", "password", "auth")
# The `error` stored for a turn whose process died under it, by the reason its session was paused.
INTERRUPTED_BY = {
    "restart": "interrupted: the server stopped before this turn finished",
    "runner_deregistered": "interrupted: the runner stopped before this turn finished",
    "runner_lost": "interrupted: the runner stopped answering before this turn finished",
}
log = logging.getLogger(__name__)


def _size(text: str | None) -> int:
    """Bytes a text column holds (what the per-session `stored_bytes` counts)."""
    return len(text.encode()) if text else 0


def mask_mcp(servers: dict[str, Any] | None) -> dict[str, Any] | None:
    """MCP server configs as shown to clients: env values and URL credentials masked."""
    if servers is None:
        return None
    shown: dict[str, Any] = {}
    for name, cfg in servers.items():
        cfg = dict(cfg) if isinstance(cfg, dict) else cfg
        if isinstance(cfg, dict) and isinstance(cfg.get("env"), dict):
            cfg["env"] = {k: "***" for k in cfg["env"]}
        if isinstance(cfg, dict) and isinstance(cfg.get("headers"), dict):
            cfg["headers"] = {k: ("***" if any(h in k.lower() for h in _SECRET_HINTS) else v)
                              for k, v in cfg["headers"].items()}
        shown[name] = cfg
    return shown


def session_json(row: Session | Row[Any]) -> dict[str, Any]:
    config = json.loads(row.config or "{}")
    out: dict[str, Any] = {
        "id": row.id,
        "tenantId": row.tenant_id,
        "agentName": row.agent_name,
        "sandboxId": row.sandbox_id,
        "status": row.status,
        "model": row.model,
        "runnerId": row.runner_id,
        "parentSessionId": row.parent_session_id,
        "createdAt": iso(row.created_at),
        "lastActiveAt": iso(row.last_active_at),
    }
    for key in ("systemPrompt", "permissionMode", "allowedTools", "disallowedTools", "betas", "subagents",
                "initialAgent", "network", "diskMb"):
        if key in config:
            out[key] = config[key]
    if "mcpServers" in config:
        out["mcpServers"] = mask_mcp(config["mcpServers"])
    if row.credential_id:
        out["credentialId"] = row.credential_id
    if row.env_ciphertext is not None:
        out["extraEnv"] = {k: "***" for k in config.get("extraEnvKeys", [])}
    if row.error:
        out["error"] = row.error
    return out


@dataclass(frozen=True)
class FrameRow:
    sequence: int
    event: str
    data: str


@dataclass(frozen=True)
class EventRecord:
    """One stored event; `frame_event`/`frame_data` set when it is also an SSE frame."""

    sequence: int
    type: str
    data: Any
    frame_event: str | None = None
    frame_data: str | None = None


class Sessions:
    """`owner_id`: the process whose sandboxes this repository's writes claim (runtime's local
    sessions); rows it inserts for itself, and every sandbox it claims, are stamped with it."""

    def __init__(self, db: Database, owner_id: str | None = None) -> None:
        self.db = db
        self.owner_id = owner_id

    def _stamp(self, row: Session) -> None:
        # A row routed to a runner (runner_id set by the coordinator) is the runner's to claim.
        if self.owner_id and row.owner_id is None and row.runner_id in (None, self.owner_id):
            row.owner_id = self.owner_id

    async def insert(self, row: Session) -> Session:
        return await self.db.run_direct(self._insert_tx(row))

    def insert_soon(self, row: Session) -> Future[Session] | Awaitable[Session]:
        """`insert`, run there and then on SQLite when the database is free (a resolved future: no
        trip to the writer thread and back), else the coroutine to await (`transition_soon`)."""
        tx = self._insert_tx(row)
        return self.db.direct_here(tx) or self.db.run_direct(tx)

    def _insert_tx(self, row: Session) -> Callable[[Statements], Session]:
        row.stored_bytes = _size(row.config)
        self._stamp(row)
        values = with_defaults(_SESSIONS, {key: value for key, value in vars(row).items() if key in _SESSIONS.c})

        def run(x: Statements) -> Session:
            x.run(_INSERT_SESSION, values)
            return from_row(Session, values)  # a new object: `row` itself is not filled in

        return run

    # Reads run in one trip to a reader thread (`Database.run_read`), not a trip per statement as
    # through aiosqlite: GET .../messages 3.3 -> 1.6 ms (docs/performance.md, fifteenth pass).
    # One prebuilt statement (`Database.read_rows`): on PostgreSQL, where a coordinator reads the
    # row on every request for a session, one round trip on the driver rather than an ORM session.
    async def get(self, tenant: str, session_id: str) -> Session:
        rows = await self.db.read_rows(_ROW, {"id": session_id, "tenant": tenant})
        if not rows:
            raise NotFound(f"Session {session_id} not found")
        return from_row(Session, rows[0])

    async def get_any(self, session_id: str) -> Session | None:
        rows = await self.db.read_rows(_ROW_ANY, {"id": session_id})
        return from_row(Session, rows[0]) if rows else None

    async def list_views(self, tenant: str, agent: str | None, limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
        """The tenant's sessions as clients see them (`session_json`), newest first: the columns the
        view shows, each row's view built on the reader's thread. Whole rows loaded through the ORM,
        their views built on the loop, took twice as long: a full page 40 ms over HTTP, a third of it
        on the loop's thread (docs/performance.md, thirty-seventh pass)."""
        query = _LISTED_BY_AGENT if agent else _LISTED
        params = {"tenant": tenant, "agent": agent, "limit": limit}
        return await self.db.run_read(lambda s: [session_json(row) for row in s.execute(query, params)])

    async def transition(self, session_id: str, tenant: str, status: str, action: str, *,
                         extra: dict[str, Any] | None = None, fence: str | None = None, agent: str | None = None,
                         **values: Any) -> Session:
        """Set the status (and other columns) and store the lifecycle event, in one transaction.

        One UPDATE sets the status, allocates the event's sequence and returns the row; one INSERT
        stores the event. Transitions are on the hot path of pause and resume.

        `fence`, a runner id: write only unless another runner holds the session live, else raise
        `SessionHeldElsewhere` and write nothing. A runner's actors pass their runner's id, so one
        that was wrongly declared dead cannot pause (or fail, or end) a session resumed elsewhere.

        `agent`, an agent name: write only if the tenant still has that agent, else raise NotFound
        and write nothing (a warm resume checks its agent this way, in the same transaction, instead
        of a lookup of its own before it).
        """
        return await self.db.run_direct(self._transition_tx(session_id, tenant, status, action, extra, fence, agent,
                                                            values), one_write=True)

    def transition_soon(self, session_id: str, tenant: str, status: str, action: str, *,
                        extra: dict[str, Any] | None = None, fence: str | None = None, agent: str | None = None,
                        **values: Any) -> Future[Session] | Awaitable[Session]:
        """`transition`, from an actor's thread: on SQLite run there and then (a resolved future: no
        crossing to another thread and back), else the coroutine to await on the loop."""
        tx = self._transition_tx(session_id, tenant, status, action, extra, fence, agent, values)
        return self.db.direct_here(tx) or self.db.run_direct(tx, one_write=True)

    def _transition_tx(self, session_id: str, tenant: str, status: str, action: str, extra: dict[str, Any] | None,
                       fence: str | None, agent: str | None,
                       values: dict[str, Any]) -> Callable[[Statements], Session]:
        now = utcnow()
        data = json.dumps({"action": action, "status": status, **(extra or {})})
        if self.owner_id and values.get("sandbox_id"):
            values["owner_id"] = self.owner_id  # this process claimed a sandbox for it: its sweep's now

        key = (tuple(sorted(values)), fence is not None, agent is not None)
        statement = _transition_update(*key)
        params = {"_id": session_id, "_fence": fence, "_status": status, "_now": now, "_size": _size(data),
                  **{f"_v_{name}": value for name, value in values.items()}}
        if fence is None:
            del params["_fence"]
        if agent is not None:
            params.update(_tenant=tenant, _agent=agent)

        def run(x: Statements) -> Session:
            event_id = new_id()
            if x.combines_writes:
                updated = x.rows(_transition_with_event(*key), {**params, "_event_id": event_id, "_data": data,
                                                                "_event_at": now})
            else:
                updated = x.rows(statement, params)
            if not updated:  # why not, in the order a caller should hear it
                if agent is not None and not x.rows(_AGENT_EXISTS, {"_tenant": tenant, "_agent": agent}):
                    raise NotFound(f"Agent {agent} not found")
                holder = x.rows(_SESSION_HOLDER, {"_id": session_id})
                if not holder:
                    raise NotFound(f"Session {session_id} not found")
                raise SessionHeldElsewhere(f"Session {session_id} now runs on runner {holder[0]['runner_id']}; "
                                           "this runner's copy of it is stale and was let go")
            if not x.combines_writes:
                x.run(_INSERT_EVENT, {"id": event_id, "session_id": session_id, "tenant_id": tenant,
                                      "type": "lifecycle", "data": data, "sequence": updated[0]["next_event_seq"],
                                      "created_at": now})
            return from_row(Session, updated[0])

        return run

    async def update_config(self, session_id: str, tenant: str, model: str | None, config: dict[str, Any]) -> Session:
        """Store a session's changed config (PATCH .../config) and model; the row as it is now."""
        text = json.dumps(config)

        def run(s: SyncSession) -> Session:
            old = s.execute(select(_SESSIONS.c.config).where(
                _SESSIONS.c.id == session_id, _SESSIONS.c.tenant_id == tenant)).scalar_one_or_none()
            mapping = s.execute(
                update(_SESSIONS).where(_SESSIONS.c.id == session_id, _SESSIONS.c.tenant_id == tenant)
                .values(model=model, config=text, updated_at=utcnow(),
                        stored_bytes=_SESSIONS.c.stored_bytes + _size(text) - _size(old))
                .returning(*_SESSIONS.c)
            ).mappings().one_or_none()
            if mapping is None:
                raise NotFound(f"Session {session_id} not found")
            return Session(**dict(mapping))

        return await self.db.run_tx(run)

    async def insert_fork(self, child: Session, parent_id: str) -> Session:
        """Insert `child` (a fork of `parent_id`, same tenant) with a copy of the parent's conversation
        and the parent's `forked` lifecycle event, in one transaction. The child's messages keep their
        order, numbered from 1; its own `forked` event comes when its sandbox is up."""
        now = utcnow()
        tenant = child.tenant_id
        self._stamp(child)

        def run(s: SyncSession) -> Session:
            rows = s.execute(select(Message.role, Message.content).where(
                Message.session_id == parent_id, Message.tenant_id == tenant).order_by(Message.sequence)).all()
            child.parent_session_id = parent_id
            child.next_message_seq = len(rows)
            child.message_count = len(rows)
            child.stored_bytes = _size(child.config) + sum(_size(c) for _, c in rows)
            s.add(child)
            s.flush()
            if rows:
                s.execute(insert(Message), [
                    {"id": new_id(), "session_id": child.id, "tenant_id": tenant, "role": role, "content": content,
                     "sequence": i + 1, "created_at": now} for i, (role, content) in enumerate(rows)])
            status = s.execute(select(Session.status).where(Session.id == parent_id)).scalar_one()
            parent_event = json.dumps({"action": "forked", "status": status, "childSessionId": child.id})
            seq = allocate_sync(s, parent_id, "event")
            s.execute(update(Session).where(Session.id == parent_id).values(
                event_count=Session.event_count + 1, stored_bytes=Session.stored_bytes + _size(parent_event)))
            s.execute(insert(_EVENTS).values(id=new_id(), session_id=parent_id, tenant_id=tenant, type="lifecycle",
                                             data=parent_event, sequence=seq, created_at=now))
            s.expunge(child)
            return child

        return await self.db.run_tx(run)

    async def reserve_events(self, session_id: str, count: int) -> int:
        return await self.db.run_tx(lambda s: allocate_sync(s, session_id, "event", count))

    async def add_user_message(self, session_id: str, tenant: str, content: Any,
                               attachments: Sequence[dict[str, Any]] = ()) -> int:
        """Store a prompt. `attachments` (what the message named, as `{id, filename, mimeType, size,
        path, shownToModel}`) are recorded in it, and the attachment rows not yet linked to a message
        are linked to this one."""
        tx = self._user_message_tx(session_id, tenant, content, attachments, 0)
        return await self.db.run_direct(lambda x: tx(x)[0], one_write=not attachments)

    def begin_turn_soon(self, session_id: str, tenant: str, content: Any, attachments: Sequence[dict[str, Any]],
                        events: int, before: Callable[[], None] | None = None,
                        ) -> Future[tuple[int, int]] | Awaitable[tuple[int, int]]:
        """`add_user_message` started now from an actor's thread (see `transition_soon`), which also
        reserves the turn's first `events` event ids in the same statement: the turn's first frame
        then needs no write of its own before it is sent. Gives (message sequence, first event id).
        `before` is called first thing in the transaction where it runs at once on this thread
        (`Database.direct_here`), and not at all where it does not."""
        tx = self._user_message_tx(session_id, tenant, content, attachments, events)
        return self.db.direct_here(tx, before) or self.db.run_direct(tx, one_write=not attachments)

    def _user_message_tx(self, session_id: str, tenant: str, content: Any, attachments: Sequence[dict[str, Any]],
                         events: int) -> Callable[[Statements], tuple[int, int]]:
        now = utcnow()
        record: dict[str, Any] = {"type": "user", "content": content}
        if attachments:
            record["attachments"] = list(attachments)
        body = json.dumps(record)
        message_id = new_id()

        def run(x: Statements) -> tuple[int, int]:
            # Prebuilt statements, the sequence allocated by the same UPDATE that counts the message:
            # on the path of every message (`_direct.py`).
            counting = {"_id": session_id, "_now": now, "_size": _size(body), "_events": events}
            one = x.combines_writes and not attachments
            rows = x.rows(_USER_MESSAGE_WITH_INSERT, {**counting, "_message_id": message_id, "_tenant": tenant,
                                                      "_body": body, "_created_at": now}) if one else \
                x.rows(_USER_MESSAGE_UPDATE, counting)
            if not rows:
                raise NotFound(f"Session {session_id} not found")
            seq, last_event = int(rows[0]["next_message_seq"]), int(rows[0]["next_event_seq"])
            if not one:
                x.run(_INSERT_MESSAGE, {"id": message_id, "session_id": session_id, "tenant_id": tenant,
                                        "role": "user", "content": body, "sequence": seq, "created_at": now})
            for attachment in attachments:
                x.run(_LINK_ATTACHMENT, {"_id": attachment["id"], "_session": session_id, "_message": message_id})
            return seq, last_event - events + 1

        return run

    async def store_turn_batch(self, session_id: str, tenant: str, messages: Sequence[tuple[str, str]],
                               events: Sequence[EventRecord], usage: TurnUsage | None = None,
                               calls: Sequence[ModelCallRecord] = ()) -> Session | None:
        """Messages (role, content JSON) get sequences here; events come with reserved sequences.
        `usage` (what the turn used) and `calls` (its model calls' records) are stored in the same
        transaction: its last batch, with `done`, so no thread trip and commit of their own stand
        between the turn's end and its `done`. The batch with `done` returns the session's row as it
        leaves it; any other, None."""
        if not messages and not events and usage is None and not calls:
            return None
        now = utcnow()
        event_rows = []
        size = sum(_size(content) for _, content in messages)
        for e in events:
            data = None if e.data is None else json.dumps(e.data)
            size += _size(data) + _size(e.frame_data)
            event_rows.append({"id": new_id(), "session_id": session_id, "tenant_id": tenant, "type": e.type,
                               "data": data, "sequence": e.sequence, "frame_event": e.frame_event,
                               "frame_data": e.frame_data, "created_at": now})
        usage_events = usage_rows(tenant, session_id, usage, now) if usage is not None else []
        # The turn's end is stored with `done`: nothing to recover at a restart.
        closing = any(e.frame_event == "done" for e in events)
        statement = _turn_batch_update(closing)
        params = {"_id": session_id, "_now": now, "_messages": len(messages), "_events": len(event_rows),
                  "_size": size}

        def run(x: Statements) -> Session | None:
            # The calls first: the row the batch's UPDATE returns then has their sequences counted.
            insert_model_calls(x, calls)
            # Prebuilt statements: one UPDATE counts everything and allocates the messages' sequences,
            # then the rows go in.
            updated = x.rows(statement, params)
            if messages:
                if not updated:
                    raise NotFound(f"Session {session_id} not found")
                first = int(updated[0]["next_message_seq"]) - len(messages) + 1
                x.run_many(_INSERT_MESSAGE, [{"id": new_id(), "session_id": session_id, "tenant_id": tenant,
                                              "role": role, "content": content, "sequence": first + i,
                                              "created_at": now} for i, (role, content) in enumerate(messages)])
            x.run_many(_INSERT_EVENT, event_rows)  # one batch of the driver's per table
            x.run_many(INSERT_USAGE, usage_events)
            return from_row(Session, updated[0]) if closing and updated else None

        # A turn's end, when small, on the loop itself (as an inline transition): `done` waits for it,
        # and the writer thread's round trip took longer than the statements (docs/performance.md,
        # sixteenth pass). A larger one, and every batch before it, goes to the writer thread.
        rows = len(messages) + len(event_rows) + len(usage_events) + 6 * len(calls)
        here = self.db.direct_here(run) if closing and rows <= INLINE_BATCH_ROWS else None
        if here is None:
            return await self.db.run_direct(run)
        return here.result() if here.done() else await asyncio.wrap_future(here)

    async def messages(self, tenant: str, session_id: str, after: int, limit: int) -> builtins.list[dict[str, Any]]:
        """The session's messages after `after`; NotFound when the tenant has no such session (read in
        the same transaction)."""
        values = {"id": session_id, "tenant": tenant, "after": after, "limit": limit}

        def run(s: SyncSession) -> builtins.list[dict[str, Any]]:
            _tenant_session(s, tenant, session_id)
            return [{"id": r.id, "sessionId": r.session_id, "tenantId": r.tenant_id, "role": r.role,
                     "content": r.content, "sequence": r.sequence, "createdAt": iso(r.created_at)}
                    for r in s.execute(_MESSAGES_AFTER, values)]

        return await self.db.run_read(run)

    async def all_message_contents(self, session_id: str) -> builtins.list[dict[str, Any]]:
        rows = await self.db.run_read(lambda s: s.execute(_MESSAGE_CONTENTS, {"id": session_id}).scalars().all())
        return [json.loads(c) for c in rows]

    async def events(self, tenant: str, session_id: str, after: int, limit: int,
                     type_: str | None) -> builtins.list[dict[str, Any]]:
        """The session's events after `after` (of `type_` only, if given); NotFound as `messages`."""
        values = {"id": session_id, "tenant": tenant, "after": after, "limit": limit, "type": type_}
        query = _EVENTS_OF_TYPE if type_ else _EVENTS_AFTER

        def run(s: SyncSession) -> builtins.list[dict[str, Any]]:
            _tenant_session(s, tenant, session_id)
            return [{"id": r.id, "sessionId": r.session_id, "tenantId": r.tenant_id, "type": r.type, "data": r.data,
                     "sequence": r.sequence, "createdAt": iso(r.created_at)} for r in s.execute(query, values)]

        return await self.db.run_read(run)

    async def frames_after(self, session_id: str, after: int, limit: int = 500) -> builtins.list[FrameRow]:
        rows = await self.db.run_read(lambda s: s.execute(_FRAMES_AFTER, {"id": session_id, "after": after,
                                                                          "limit": limit}).all())
        return [FrameRow(r[0], r[1] or "", r[2] or "") for r in rows]

    async def purge(self, tenant: str, session_id: str) -> None:
        """Delete an ended session with its messages, events and attachments (usage events stay: they
        are the operator's accounting, not the tenant's data)."""

        def run(s: SyncSession) -> None:
            found = s.execute(select(Session.status).where(Session.id == session_id,
                                                           Session.tenant_id == tenant)).scalar_one_or_none()
            if found is None:
                raise NotFound(f"Session {session_id} not found")
            s.execute(delete(SessionEvent).where(SessionEvent.session_id == session_id))
            s.execute(delete(Message).where(Message.session_id == session_id))
            s.execute(delete(Attachment).where(Attachment.session_id == session_id))
            s.execute(delete(Session).where(Session.id == session_id))

        await self.db.run_tx(run)

    async def owners_of_sandboxes(self, sandbox_ids: Sequence[str], *, ended: bool = False) -> dict[str, str]:
        """Sandbox id -> session id, for the sessions (not ended, unless `ended`) that last ran in
        those sandboxes."""
        if not sandbox_ids:
            return {}
        query = select(Session.sandbox_id, Session.id).where(Session.sandbox_id.in_(list(sandbox_ids)))
        if not ended:
            query = query.where(Session.status != "ended")
        rows = await self.db.run_read(lambda s: s.execute(query).all())
        return {r[0]: r[1] for r in rows}

    async def pause_orphans(self, runner_id: str | None = None, reason: str = "restart", *,
                            owner_id: str | None = None, unowned: bool = False,
                            on_paused: Callable[[str, str, str, str], Awaitable[None]] | None = None
                            ) -> builtins.list[str]:
        """Sessions left `active`/`starting` by a dead process become `paused`, in bulk.

        `runner_id`: the sessions routed to that runner (deregistration, liveness). `owner_id`: the
        start-up sweep of that process: the sessions whose sandboxes it owned, or that are routed to
        it; `unowned` adds rows with no owner at all (legacy rows, SQLite standalone only). Neither:
        every such session (only tests and a single-process database want that).
        `on_paused(tenant, session id, agent name, status before)` is awaited for each, once stored.
        """
        async with self.db.tx() as s:
            query = select(Session.id, Session.tenant_id, Session.turn_open, Session.agent_name, Session.status).where(
                Session.status.in_(("active", "starting")))
            if runner_id is not None:
                query = query.where(Session.runner_id == runner_id)
            if owner_id is not None:
                mine = or_(Session.owner_id == owner_id, Session.runner_id == owner_id)
                if unowned:
                    mine = or_(mine, and_(Session.owner_id.is_(None), Session.runner_id.is_(None)))
                query = query.where(mine)
            rows = (await s.execute(query)).all()
            ids = await pause_rows(s, rows, reason)
        if on_paused is not None:
            for sid, tenant, _turn_open, agent, status in rows:
                if sid in ids:
                    await on_paused(tenant, sid, agent, status)
        return ids


async def pause_selected(s: AsyncSession, query: Select[str, str, bool], reason: str) -> builtins.list[str]:
    """Pause the sessions `query` selects (id, tenant id, turn_open) inside transaction `s`: one bulk
    status update, then a `paused` lifecycle event each. A turn left running (`turn_open`) is stored
    as interrupted first: an `error` frame with the reason, then its `done`, so a replay of the
    stream ends as every stream does. Returns the paused ids."""
    return await pause_rows(s, (await s.execute(query)).all(), reason)


async def pause_rows(s: AsyncSession, rows: Sequence[Any], reason: str) -> builtins.list[str]:
    """`pause_selected` for rows already read (id, tenant id, turn_open, ...)."""
    if not rows:
        return []
    ids = [r[0] for r in rows]
    now = utcnow()
    await s.execute(update(Session).where(Session.id.in_(ids)).values(status="paused", updated_at=now,
                                                                      turn_open=False))
    cut = INTERRUPTED_BY.get(reason, f"interrupted: the turn was cut short ({reason})")
    paused = json.dumps({"action": "paused", "status": "paused", "reason": reason})
    for sid, tenant, turn_open, *_ in rows:
        added: list[str | None] = [paused]
        if turn_open:
            first = await allocate(s, sid, "event", 2)
            error = json.dumps({"error": cut})
            done = json.dumps({"sessionId": sid})
            s.add(SessionEvent(id=new_id(), session_id=sid, tenant_id=tenant, type="error",
                               data=error, sequence=first, frame_event="error", frame_data=error,
                               created_at=now))
            s.add(SessionEvent(id=new_id(), session_id=sid, tenant_id=tenant, type="frame", data=None,
                               sequence=first + 1, frame_event="done", frame_data=done, created_at=now))
            added += [error, error, done]
        seq = await allocate(s, sid, "event")
        s.add(SessionEvent(id=new_id(), session_id=sid, tenant_id=tenant, type="lifecycle",
                           data=paused, sequence=seq, created_at=now))
        await s.execute(update(Session).where(Session.id == sid).values(
            event_count=Session.event_count + (3 if turn_open else 1),
            stored_bytes=Session.stored_bytes + sum(_size(x) for x in added)))
    if any(r[2] for r in rows):
        log.warning("recorded turns cut short as interrupted", extra={"count": sum(1 for r in rows if r[2]),
                                                                      "reason": reason})
    return ids


def _tenant_session(s: SyncSession, tenant: str, session_id: str) -> Session:
    """The tenant's session `session_id`; NotFound for an unknown one or another tenant's."""
    row: Session | None = s.execute(_GET, {"id": session_id, "tenant": tenant}).scalar_one_or_none()
    if row is None:
        raise NotFound(f"Session {session_id} not found")
    return row
