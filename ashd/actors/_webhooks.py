"""The webhook dispatcher: a loop task that sends what the outbox holds, off every request's path.

Events are stored first (`emit` → `Webhooks.enqueue`, one row per subscribed hook), then this loop
claims due rows (a lease, so two servers never send one row at once and a crashed sender's rows are
sent again), sends each as a signed JSON POST with bounded concurrency and a timeout per attempt,
and records the outcome: delivered on a 2xx, otherwise retried with exponential backoff until
`max_attempts`, then failed. Nothing here runs inside a turn: a turn's end only stores rows (and that
after its `done` frame is sent), so a slow or dead receiver never slows a turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

import aiohttp

from ashd import __version__
from ashd.sandboxing import GuardedResolver, TargetRefused, WebhookTargets, describe_failure, split_url
from ashd.storage import ClaimedDelivery, Webhooks, utcnow

log = logging.getLogger(__name__)
MAX_BACKOFF_SECONDS = 3600.0
POLL_SECONDS = 5.0  # rows another server stored, or leases that ran out, are found at least this often


def sign(secret: str, timestamp: str, body: str) -> str:
    """`v1=<hex>`: HMAC-SHA256 of `<timestamp>.<body>` with the hook's secret."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"v1={mac}"


@dataclass(frozen=True)
class DispatchConfig:
    concurrency: int = 8
    timeout_seconds: float = 10.0
    max_attempts: int = 8
    backoff_seconds: float = 10.0  # the wait after the first failed attempt; doubled after each next one

    def retry_in(self, attempt: int) -> float:
        return float(min(MAX_BACKOFF_SECONDS, self.backoff_seconds * 2 ** (attempt - 1)))


class WebhookDispatcher:
    def __init__(self, store: Webhooks, targets: WebhookTargets, config: DispatchConfig) -> None:
        self.store = store
        self.targets = targets
        self.config = config
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closing = False

    # --- events --------------------------------------------------------------------------------
    async def emit(self, tenant: str, event: str, data: dict[str, Any],
                   occurred_at: dt.datetime | None = None) -> list[str]:
        """Store one delivery per hook subscribed when the event happened (`occurred_at`, default
        now) and wake the loop; never raises (an event that cannot be stored is logged, and the
        caller, a turn or a status change, goes on)."""
        try:
            ids = await self.store.enqueue(tenant, event, data, occurred_at=occurred_at or utcnow())
        except Exception:
            log.exception("webhook event could not be stored", extra={"tenant": tenant, "event": event})
            return []
        if ids:
            self._wake.set()
        return ids

    def emit_soon(self, tenant: str, event: str, data: dict[str, Any],
                  occurred_at: dt.datetime | None = None) -> None:
        """`emit` in a task of its own (from code on the event loop that must not wait for it); the
        event happened now, or at `occurred_at` (a status change handed over from an actor's thread)."""
        at = occurred_at or utcnow()
        self._track(asyncio.ensure_future(self._emit_quietly(tenant, event, data, at)))

    async def _emit_quietly(self, tenant: str, event: str, data: dict[str, Any], at: dt.datetime) -> None:
        await self.emit(tenant, event, data, at)

    async def queue_item_finished(self, tenant: str, *, item_id: str, status: str, session_id: str | None,
                                  agent_name: str | None, error: str | None = None, attempts: int | None = None,
                                  extra: dict[str, Any] | None = None) -> list[str]:
        """For the queue: a queue item reached an end state (`completed`, `failed` or `cancelled`).
        Awaiting it only stores the event's deliveries (one insert); sending happens later."""
        data: dict[str, Any] = {"itemId": item_id, "status": status, "sessionId": session_id,
                                "agentName": agent_name, "error": error, "attempts": attempts, **(extra or {})}
        return await self.emit(tenant, "queue.item_finished", data)

    async def test(self, tenant: str, webhook_id: str) -> str:
        ids = await self.store.enqueue(tenant, "webhook.test", {"message": "a test delivery from ashd"},
                                       webhook_id=webhook_id)
        self._wake.set()
        return ids[0]

    # --- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(resolver=GuardedResolver(self.targets), limit=self.config.concurrency,
                                           force_close=True),
            timeout=aiohttp.ClientTimeout(total=self.config.timeout_seconds), trust_env=False,
            headers={"User-Agent": f"ashd-webhooks/{__version__}"})
        self._loop_task = asyncio.create_task(self._run(), name="webhook-dispatcher")

    async def close(self) -> None:
        """Stop claiming; attempts under way are cancelled (their rows are leased, and sent again
        when the lease runs out)."""
        # The flag as well as the cancel: before 3.12, `asyncio.wait_for` can hide a cancellation
        # that meets the end of its wait (CPython gh-86296), and the loop ran on: a stop that hung.
        self._closing = True
        self._wake.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            try:
                await self._dispatch_due()
                wait = await self._until_next()
            except Exception:
                log.exception("webhook dispatcher: reading the outbox failed; trying again")
                wait = POLL_SECONDS
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _until_next(self) -> float:
        due = await self.store.next_due()
        if due is None:
            return POLL_SECONDS
        return max(0.05, min(POLL_SECONDS, (due - utcnow()).total_seconds()))

    async def _dispatch_due(self) -> None:
        for delivery_id in await self.store.due(self.config.concurrency * 4):
            if delivery_id in self._inflight:
                continue
            await self._slots.acquire()  # bounded concurrency: wait for a free slot
            claimed = await self._claim(delivery_id)
            if claimed is None:
                self._slots.release()
                continue
            self._inflight.add(delivery_id)
            self._track(asyncio.ensure_future(self._attempt(claimed)))

    async def _claim(self, delivery_id: str) -> ClaimedDelivery | None:
        try:
            # The lease outlasts the attempt's timeout, so only a dead sender's rows are taken over.
            return await self.store.claim(delivery_id, self.config.timeout_seconds + 30.0)
        except Exception:
            log.exception("webhook delivery could not be claimed", extra={"deliveryId": delivery_id})
            return None

    def _track(self, task: asyncio.Future[None]) -> None:
        assert isinstance(task, asyncio.Task)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, claimed: ClaimedDelivery) -> None:
        try:
            started = time.monotonic()
            code, error = await self._send(claimed)
            delivered = code is not None and 200 <= code < 300
            retry_in = None if delivered or claimed.attempt >= self.config.max_attempts else \
                self.config.retry_in(claimed.attempt)
            if error is None and not delivered:
                error = f"the receiver answered {code}"
            await self.store.record(claimed.id, delivered=delivered, status_code=code, error=error,
                                    retry_in=retry_in)
            log.info("webhook delivery %s", "delivered" if delivered else "failed", extra={
                "deliveryId": claimed.id, "webhookId": claimed.webhook_id, "event": claimed.event,
                "attempt": claimed.attempt, "statusCode": code, "ms": round((time.monotonic() - started) * 1000),
                "retryIn": retry_in})
            if retry_in is not None:
                self._wake.set()  # the loop recomputes when the next row is due
        except asyncio.CancelledError:
            # The server is stopping: give the lease back, so that the next start (or another
            # server) sends it at once instead of after the lease. The attempt is not counted.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(claimed.id))
            raise
        except Exception:
            log.exception("webhook delivery could not be recorded", extra={"deliveryId": claimed.id})
        finally:
            self._inflight.discard(claimed.id)
            self._slots.release()

    async def _send(self, claimed: ClaimedDelivery) -> tuple[int | None, str | None]:
        """(status code, error) of one POST; the body is read at most 1 KiB, never trusted."""
        assert self._http is not None
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Ashd-Event": claimed.event,
                   "X-Ashd-Delivery": claimed.id, "X-Ashd-Timestamp": timestamp,
                   "X-Ashd-Signature": sign(claimed.secret, timestamp, claimed.body)}
        try:
            host, port = split_url(claimed.url)
            with contextlib.suppress(ValueError):
                # aiohttp does not resolve a literal address: it is checked here instead.
                ip_address(host.strip("[]"))
                await self.targets.resolve(host, port)
            async with self._http.post(claimed.url, data=claimed.body.encode(), headers=headers,
                                       allow_redirects=False) as resp:
                with contextlib.suppress(Exception):
                    await resp.content.read(1024)
                return resp.status, None
        except TargetRefused as exc:
            return None, f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - connection refused, reset, timeout: all are a failed attempt
            return None, describe_failure(exc)
