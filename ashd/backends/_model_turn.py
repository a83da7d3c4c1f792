"""The model proxy's view of one turn: opened before the query, closed and stored before `done`."""

from __future__ import annotations

import logging
from typing import Any

from ashd.actors import TurnTicket
from ashd.sandboxing import TurnSummary

log = logging.getLogger(__name__)


class ModelTurn:
    def __init__(self, proxy: Any, ticket: TurnTicket, budget_usd: float | None) -> None:
        self._proxy = proxy
        self._ticket = ticket
        self._summary: TurnSummary | None = None
        if proxy is not None:
            # Calls are allowed from now on, for the turn's model and within its maxBudgetUsd.
            proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, budget_usd)

    def end(self) -> TurnSummary:
        if self._summary is None:
            self._summary = (self._proxy.end_turn(self._ticket.sandbox_id, self._ticket.query_id)
                             if self._proxy is not None else TurnSummary())
        return self._summary

    async def finish(self) -> TurnSummary:
        summary = self.end()
        if self._proxy is not None:
            try:
                await self._proxy.flush()
            except Exception:  # noqa: BLE001 - the records stay queued and are retried; the turn goes on
                log.warning("model call records not stored yet", extra={"sessionId": self._ticket.session_id})
        return summary
