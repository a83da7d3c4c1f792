"""Spend budgets checked at the proxy: per turn (`maxBudgetUsd` of the message), per session and per
tenant per calendar month (UTC).

A call is admitted while what is spent plus the worst case of the calls still in flight is below
the budget; an admitted call reserves its own worst case (all of `max_tokens`, its input priced as
cache writes) until its real cost is known. So concurrent calls cannot all slip under a budget
together: the overshoot is at most one call.

Spend comes from the stored model calls. A session's calls are made in one process at a time, so
its spend is loaded once and then counted here. A tenant's calls may be made by several servers
sharing one database: its spend is re-read at most every `refresh_s` seconds (after storing this
process's own records) and this process's calls since then are added on top.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, Refusal, usd

log = logging.getLogger(__name__)
TENANT_REFRESH_S = 5.0


@dataclass
class TurnState:
    query_id: str
    model: str
    budget_usd: float | None
    spent: float = 0.0
    reserved: float = 0.0
    calls: int = 0
    model_ms: float = 0.0
    # Set while the turn's prompt is still being stored (`ModelProxy.begin_turn(held=True)`): its
    # calls wait for it before they are forwarded; it fails when the turn is withdrawn instead.
    stored: asyncio.Future[None] | None = None


@dataclass(frozen=True)
class TurnSummary:
    calls: int = 0
    model_ms: float = 0.0
    cost_usd: float = 0.0


@dataclass
class SessionSpend:
    spent: float | None = None  # None until loaded from storage
    reserved: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def month_start(now: dt.datetime | None = None) -> dt.datetime:
    now = now or dt.datetime.now(dt.UTC)
    return dt.datetime(now.year, now.month, 1, tzinfo=dt.UTC)


def next_month(start: dt.datetime) -> dt.datetime:
    return dt.datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=dt.UTC)


@dataclass
class _TenantEntry:
    period: dt.datetime
    base: float = 0.0  # stored spend at the last refresh
    local_total: float = 0.0  # this process's completed spend since the entry was made
    local_at_base: float = 0.0
    reserved: float = 0.0
    loaded_at: float = -1e18
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def spent(self) -> float:
        return self.base + self.local_total - self.local_at_base


class BudgetUnavailable(Exception):
    pass


class TenantLedger:
    def __init__(self, load: Callable[[str, dt.datetime], Awaitable[float]] | None,
                 flush: Callable[[], Awaitable[None]], refresh_s: float = TENANT_REFRESH_S) -> None:
        self._load = load
        self._flush = flush
        self.refresh_s = refresh_s
        self._entries: dict[str, _TenantEntry] = {}

    async def entry(self, tenant: str) -> _TenantEntry:
        period = month_start()
        e = self._entries.get(tenant)
        if e is None or e.period != period:
            e = self._entries[tenant] = _TenantEntry(period)
        if time.monotonic() - e.loaded_at > self.refresh_s:
            async with e.lock:
                if time.monotonic() - e.loaded_at > self.refresh_s:
                    await self._refresh(tenant, e)
        return e

    async def _refresh(self, tenant: str, e: _TenantEntry) -> None:
        if self._load is None:
            e.loaded_at = time.monotonic()
            return
        mark = e.local_total
        try:
            await self._flush()  # this process's own finished calls are in storage before the sum
            base = await self._load(tenant, e.period)
        except Exception as exc:
            log.warning("could not read the spend of tenant %s", tenant, exc_info=True)
            if e.loaded_at < 0:
                raise BudgetUnavailable(str(exc)) from exc
            return  # keep the last figure; the next call tries again
        # Calls finished between `mark` and the sum may be counted twice until the next refresh: the
        # error is on the side of more spend, never less.
        e.base, e.local_at_base, e.loaded_at = base, mark, time.monotonic()

    def settle(self, tenant: str, reserved: float, cost: float) -> None:
        e = self._entries.get(tenant)
        if e is not None and e.period == month_start():
            e.reserved = max(0.0, e.reserved - reserved)
            e.local_total += cost


def turn_refusal(turn: TurnState) -> Refusal | None:
    if turn.budget_usd is None or turn.spent + turn.reserved < turn.budget_usd:
        return None
    return Refusal(402, "billing_error", "turn_budget",
                   f"this message's maxBudgetUsd of {usd(turn.budget_usd)} is used up ({usd(turn.spent)} spent"
                   f"{_in_flight(turn.reserved)}); send the message again with a higher maxBudgetUsd")


def session_refusal(spend: SessionSpend, budget: float) -> Refusal | None:
    spent = spend.spent or 0.0
    if spent + spend.reserved < budget:
        return None
    return Refusal(402, "billing_error", "session_budget",
                   f"this session's model budget of {usd(budget)} is used up ({usd(spent)} spent"
                   f"{_in_flight(spend.reserved)}); start a new session, or ask the operator to raise "
                   "SERVICE_MODEL_SESSION_BUDGET_USD")


def tenant_refusal(tenant: str, entry: _TenantEntry, budget: float) -> Refusal | None:
    if entry.spent + entry.reserved < budget:
        return None
    return Refusal(402, "billing_error", "tenant_budget",
                   f"tenant {tenant!r} has used its model budget of {usd(budget)} for "
                   f"{entry.period:%Y-%m} (UTC calendar month; {usd(entry.spent)} spent"
                   f"{_in_flight(entry.reserved)}); it renews on {next_month(entry.period):%Y-%m-%d}, or the "
                   "operator can raise SERVICE_MODEL_TENANT_BUDGET_USD / SERVICE_MODEL_TENANT_BUDGETS")


def _in_flight(reserved: float) -> str:
    return f", up to {usd(reserved)} more in calls still running" if reserved > 0 else ""


class Budgets:
    """Admission against the three budgets, and settlement once a call's real cost is known."""

    def __init__(self, policy: ModelPolicy, session_spend: Callable[[str], Awaitable[float]] | None,
                 tenant_spend: Callable[[str, dt.datetime], Awaitable[float]] | None,
                 flush: Callable[[], Awaitable[None]]) -> None:
        self.policy = policy
        self._session_spend = session_spend
        self._flush = flush
        self.tenants = TenantLedger(tenant_spend, flush)

    async def admit(self, binding: ModelBinding, spend: SessionSpend, turn: TurnState, model: str,
                    input_tokens: int, max_tokens: int) -> float | Refusal:
        """Check the budgets and reserve this call's worst case; returns the reservation."""
        session_budget = self.policy.session_budget_usd
        tenant_budget = self.policy.tenant_budget(binding.tenant)
        try:  # every await first, so the checks and the reservation below happen in one step
            if session_budget is not None:
                await self._load_session_spend(binding.session_id, spend)
            entry = await self.tenants.entry(binding.tenant) if tenant_budget is not None else None
        except BudgetUnavailable:
            return Refusal(503, "api_error", "budget_unavailable",
                           "model proxy: the spend so far could not be read to check the budget; try again")
        refusal = turn_refusal(turn)
        if refusal is None and session_budget is not None:
            refusal = session_refusal(spend, session_budget)
        if refusal is None and entry is not None and tenant_budget is not None:
            refusal = tenant_refusal(binding.tenant, entry, tenant_budget)
        if refusal is not None:
            return refusal
        worst = self.policy.prices.worst_case(model, input_tokens, max_tokens)
        turn.reserved += worst
        spend.reserved += worst
        if entry is not None:
            entry.reserved += worst
        return worst

    async def _load_session_spend(self, session_id: str, spend: SessionSpend) -> None:
        if spend.spent is not None:
            return
        async with spend.lock:
            if spend.spent is not None:
                return
            if self._session_spend is None:
                spend.spent = 0.0
                return
            try:
                await self._flush()  # this process's own finished calls are in storage before the sum
                spend.spent = await self._session_spend(session_id)
            except Exception as exc:
                log.warning("could not read the spend of session %s", session_id, exc_info=True)
                raise BudgetUnavailable(str(exc)) from exc

    def settle(self, tenant: str, spend: SessionSpend, turn: TurnState | None, reserved: float,
               cost: float) -> None:
        if turn is not None:
            turn.reserved = max(0.0, turn.reserved - reserved)
            turn.spent += cost
        spend.reserved = max(0.0, spend.reserved - reserved)
        if spend.spent is not None:
            spend.spent += cost
        self.tenants.settle(tenant, reserved, cost)
