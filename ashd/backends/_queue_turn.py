"""One queue item, run as a normal turn through the `SessionBackend`.

The item's session is the one it names, or a new one created the way POST /api/sessions creates
it (the agent resolved, the tenant's storage limit checked, the agent's disk size pinned). The turn
is stored, streamed to `GET …/stream` followers and metered like any other; its `result` message
decides the outcome. A session the queue created is paused after the turn, so idle queue sessions
hold no sandbox; the client resumes it to go on with the conversation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ashd.backends._protocol import Message, NewSession, SessionBackend
from ashd.errors import ServiceError
from ashd.metrics import Metrics
from ashd.storage import Agents, Backoff, Claimed, QueueItems, TenantStorage, new_id

log = logging.getLogger(__name__)


class TurnFailed(Exception):
    """The turn ran and ended in an error (the model refused, the sandbox failed, ...)."""


@dataclass(frozen=True)
class QueueTurns:
    backend: SessionBackend
    items: QueueItems
    agents: Agents
    tenant_storage: TenantStorage
    owner: str
    backoff: Backoff
    disk_max_mb: int
    metrics: Metrics | None = None
    # Told when an item reaches an end state: the webhooks' queue.item_finished (stored, sent later).
    on_finished: Callable[..., Awaitable[Any]] | None = None

    async def run(self, item: Claimed) -> None:
        created: str | None = None
        parked = False
        session_id = item.session_id
        try:
            if session_id is None:
                session_id = created = await self._new_session(item)
                await self.items.use_session(item.id, self.owner, session_id)
            else:
                await self._ready(item.tenant, session_id)
            await self.tenant_storage.require_room(item.tenant, "a queued prompt")
            result = await self._turn(item.tenant, session_id, item.prompt)
        except Exception as exc:  # noqa: BLE001 - every failure of an attempt is recorded on the item
            reason = _reason(exc)
            status = await self.items.attempt_failed(item.id, self.owner, reason, self.backoff)
            log.info("queue item attempt failed", extra={"itemId": item.id, "sessionId": session_id,
                                                         "error": reason, "status": status})
            self._count({"pending": "retry", "failed": "failed"}.get(status or "", "lost"))
            if status == "failed":
                await self._finished(item, "failed", session_id, reason)
        else:
            if created is not None:
                # Paused before the item shows `completed`: a client that sees it finds the session parked.
                await self._park(item.tenant, created)
                parked = True
            if await self.items.complete(item.id, self.owner, result):
                self._count("completed")
                await self._finished(item, "completed", session_id, None)
            else:
                log.warning("a queue item finished after its claim was lost", extra={"itemId": item.id})
                self._count("lost")
        finally:
            if created is not None and not parked:
                await self._park(item.tenant, created)

    async def _finished(self, item: Claimed, status: str, session_id: str | None, error: str | None) -> None:
        if self.on_finished is None:
            return
        try:  # the item's end is stored whatever its listener does
            await self.on_finished(item.tenant, item_id=item.id, status=status, session_id=session_id,
                                   agent_name=item.agent_name, error=error, attempts=item.retry_count + 1)
        except Exception:
            log.exception("queue.item_finished could not be scheduled", extra={"itemId": item.id})

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.count_queue_attempt(outcome)

    async def _new_session(self, item: Claimed) -> str:
        agent = await self.agents.resolve(item.tenant, item.agent_name)
        await self.tenant_storage.require_room(item.tenant, "a new session")
        config: dict[str, Any] = {}
        if agent.disk_mb is not None and agent.disk_mb <= self.disk_max_mb:
            config["diskMb"] = agent.disk_mb
        new = NewSession(session_id=new_id(), tenant=item.tenant, agent_name=item.agent_name, model=None,
                         config=config, agent=agent)
        view = await self.backend.create(new)
        return str(view["id"])

    async def _ready(self, tenant: str, session_id: str) -> None:
        """The session must be active to take a turn: a paused or stopped one is resumed."""
        view = await self.backend.view(tenant, session_id)
        if view.get("status") != "active":
            await self.backend.resume(tenant, session_id)

    async def _turn(self, tenant: str, session_id: str, prompt: str) -> str | None:
        turn = await self.backend.message(tenant, session_id, Message(prompt))
        result: dict[str, Any] | None = None
        errors: list[str] = []
        try:
            async for frame in turn:
                if frame.event == "error":
                    errors.append(str(_json(frame.data).get("error") or frame.data))
                elif frame.event == "message":
                    data = _json(frame.data)
                    if data.get("type") == "result":
                        result = data
        finally:
            turn.detach()
        if errors:
            raise TurnFailed("; ".join(errors))
        if result is None:
            raise TurnFailed("the turn ended without a result")
        if result.get("is_error"):
            raise TurnFailed(f"the turn ended with {result.get('subtype') or 'an error'}: "
                             f"{result.get('result') or ''}".rstrip(": "))
        value = result.get("result")
        return value if isinstance(value, str) else None

    async def _park(self, tenant: str, session_id: str) -> None:
        try:
            view = await self.backend.view(tenant, session_id)
            if view.get("status") == "active":
                await self.backend.pause(tenant, session_id)
        except Exception as exc:  # noqa: BLE001 - it stays active and idles out like any session
            log.warning("could not pause a queue item's session: %s", exc, extra={"sessionId": session_id})


def _json(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _reason(exc: Exception) -> str:
    if isinstance(exc, ServiceError):
        return exc.message
    return str(exc) or type(exc).__name__
