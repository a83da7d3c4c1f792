"""The model proxy's view of one turn: opened before the query, closed and stored before `done`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ashd.actors import TurnTicket
from ashd.sandboxing import TurnSummary
from ashd.storage import ModelCallRecord


class ModelTurn:
    def __init__(self, proxy: Any, ticket: TurnTicket, budget_usd: float | None, *, begun: bool = False,
                 held: bool = False) -> None:
        """`begun`: another ModelTurn opened the turn already (`TurnDriver.send_query`). `held`: the
        turn's prompt is still being stored; its calls wait for `admit` (`ModelProxy.begin_turn`)."""
        self._proxy = proxy
        self._ticket = ticket
        self._summary: TurnSummary | None = None
        if proxy is not None and not begun:
            # Calls are allowed from now on, for the turn's model and within its maxBudgetUsd.
            proxy.begin_turn(ticket.sandbox_id, ticket.query_id, ticket.model, budget_usd, held=held)

    def admit(self) -> None:
        """The held turn's prompt is stored: its calls go on."""
        if self._proxy is not None:
            self._proxy.admit_turn(self._ticket.sandbox_id, self._ticket.query_id)

    def end(self) -> TurnSummary:
        if self._summary is None:
            self._summary = (self._proxy.end_turn(self._ticket.sandbox_id, self._ticket.query_id)
                             if self._proxy is not None else TurnSummary())
        return self._summary

    async def finish(self) -> tuple[TurnSummary, list[ModelCallRecord]]:
        """The turn's summary, and the records of its calls: the caller stores them with the turn's
        `done` (`TurnRecorder.done`) and hands back (`give_back`) what it could not store."""
        summary = self.end()
        if self._proxy is None:
            return summary, []
        return summary, await self._proxy.take_records(self._ticket.query_id)

    def give_back(self, records: Sequence[ModelCallRecord]) -> None:
        """Records from `finish` the turn did not store: the proxy's writer stores (or retries) them."""
        if records and self._proxy is not None:
            self._proxy.requeue(records)
