"""The per-sandbox model proxy: the only way a sandbox reaches the model API, and where its model
traffic is metered, limited and recorded.

Listens on `<sandbox run dir>/model.sock` (inside: /run/ashd/model.sock) and forwards `/v1/messages`
and `/v1/messages/count_tokens` to the configured Anthropic base URL with the real credential. The
sandbox sends a dummy key; whatever auth header it sends is dropped, so no API key ever enters it.

Every call of a sandbox that a session has claimed (`bind`) is checked against the policy
(`_model_policy`: the turn's model, the max_tokens ceiling, the session's request rate, the
budgets of `_model_budget`), forwarded with the reply streamed back chunk by chunk while
`_model_meter` reads the usage out of a copy, and recorded (`_model_records`): who, which model,
the tokens the API reported, cost, status, latency. A refused call gets an Anthropic-shaped error
marked with the `x-ashd-refusal` header and is recorded too (at most `REFUSAL_RECORDS_PER_MINUTE`
rows a minute per sandbox; the rest are counted in the metrics and summarised in the next row).

aiohttp's server is used here on a Unix socket (an explicit exception to "no aiohttp.web in
domain code" granted for this module): it is an HTTP proxy, not part of the REST API.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import web

from ashd.sandboxing._model_budget import Budgets, SessionSpend, TurnState, TurnSummary
from ashd.sandboxing._model_call import ENDPOINTS, CallRecord, ParsedRequest, metrics_usage, parse_request
from ashd.sandboxing._model_meter import UsageMeter
from ashd.sandboxing._model_policy import (
    REFUSAL_HEADER,
    KeyProvider,
    ModelBinding,
    ModelPolicy,
    Refusal,
    SessionModels,
    TokenBucket,
)
from ashd.sandboxing._model_records import RecordWriter, Store
from ashd.sandboxing._upstream import UpstreamRoute
from ashd.storage import ModelCallRecord

log = logging.getLogger(__name__)

_SANDBOX_ID = web.AppKey("sandbox_id", str)
ALLOWED_PATHS = frozenset(ENDPOINTS)
REFUSAL_RECORDS_PER_MINUTE = 60
MAX_REQUEST_BYTES = 32 * 1024 * 1024  # the Messages API's own request size limit
PARSE_IN_THREAD_BYTES = 256 * 1024
# docs/operations.md, "Model traffic and budgets": a model API that accepts no connection for this
# long is a 502 to the sandbox; a reply of which no byte comes for this long is cut and recorded as
# broken (the Anthropic SDK's own default timeout: a long non-streaming reply may take minutes).
UPSTREAM_CONNECT_TIMEOUT_S = 30.0
UPSTREAM_READ_TIMEOUT_S = 600.0
# How long a call of a held turn waits for its prompt to be stored (`begin_turn(held=True)`): the
# session's actor admits or withdraws the turn once the prompt's write ends, which a stalled database
# can make long; past this the call is refused rather than held.
HELD_CALL_WAIT_S = 60.0
_DROP_REQUEST = frozenset(
    {
        "host",
        "authorization",
        "x-api-key",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",  # the proxy must read the usage: the reply comes uncompressed
    }
)
_DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date",
                            "content-encoding", REFUSAL_HEADER})


class ModelMetrics(Protocol):
    def model_call(self, model: str, outcome: str, tokens: dict[str, int], cost_usd: float,
                   seconds: float) -> None: ...

    def model_refusal(self, model: str, reason: str) -> None: ...


class _Bound:
    """A claimed sandbox's state; touched only on the event loop."""

    def __init__(self, binding: ModelBinding, policy: ModelPolicy) -> None:
        self.binding = binding
        self.turn: TurnState | None = None
        self.rate = TokenBucket(policy.rate_per_minute, policy.rate_burst) if policy.rate_per_minute else None
        self.refusal_log = TokenBucket(REFUSAL_RECORDS_PER_MINUTE, REFUSAL_RECORDS_PER_MINUTE)
        self.suppressed = 0
        self.spend = SessionSpend()


class _Withdrawn(Exception):
    """The turn ended before its prompt was stored."""


def _refuse_held(turn: TurnState) -> None:
    if turn.stored is not None and not turn.stored.done():
        turn.stored.set_exception(_Withdrawn())
        turn.stored.exception()  # retrieved: no "never retrieved" warning when no call waited


def _error(refusal: Refusal) -> web.Response:
    return web.json_response(refusal.body(), status=refusal.status, headers=refusal.headers())


class ModelProxy:
    def __init__(self, base_url: str, *, default_key: KeyProvider | None = None,
                 timeout_s: float = UPSTREAM_READ_TIMEOUT_S, policy: ModelPolicy | None = None,
                 store: Store | None = None,
                 session_spend: Callable[[str], Awaitable[float]] | None = None,
                 tenant_spend: Callable[..., Awaitable[float]] | None = None,
                 metrics: ModelMetrics | None = None, server_id: str = "",
                 route: UpstreamRoute | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.route = route or UpstreamRoute()
        self.policy = policy or ModelPolicy()
        self._default_key = default_key
        self._timeout = timeout_s
        self._keys: dict[str, KeyProvider] = {}
        self._bound: dict[str, _Bound] = {}
        self._sites: dict[str, tuple[web.AppRunner, Path]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._writer = RecordWriter(store)
        self._budgets = Budgets(self.policy, session_spend, tenant_spend, self.flush)
        self._metrics = metrics
        self._server_id = server_id

    # --- sessions and turns (called on the loop) -------------------------------------------------
    def bind(self, sandbox_id: str, binding: ModelBinding) -> None:
        """A session claimed this sandbox: its calls are now checked, metered and billed to it."""
        self._bound[sandbox_id] = _Bound(binding, self.policy)

    def update_models(self, sandbox_id: str, models: SessionModels) -> None:
        """The session's model or subagents changed (PATCH .../config): its next turns may call these."""
        bound = self._bound.get(sandbox_id)
        if bound is not None:
            bound.binding = dataclasses.replace(bound.binding, models=models)

    def set_key_provider(self, sandbox_id: str, provider: KeyProvider | None) -> None:
        """Override the credential source of one sandbox (tests; the binding's key otherwise)."""
        if provider is None:
            self._keys.pop(sandbox_id, None)
        else:
            self._keys[sandbox_id] = provider

    def begin_turn(self, sandbox_id: str, query_id: str, model: str | None, budget_usd: float | None, *,
                   held: bool = False) -> None:
        """A turn starts: calls are allowed, for its model (the model precedence) and within its budget.
        `held`: its prompt is still being stored; its calls are checked as they come but forwarded only
        once `admit_turn` says it is stored (none is, if the turn ends first)."""
        bound = self._bound.get(sandbox_id)
        if bound is not None:
            stored = asyncio.get_running_loop().create_future() if held else None
            bound.turn = TurnState(query_id, model or bound.binding.models.default, budget_usd, stored=stored)

    def admit_turn(self, sandbox_id: str, query_id: str) -> None:
        """The held turn's prompt is stored: its calls go on (`begin_turn`)."""
        bound = self._bound.get(sandbox_id)
        turn = bound.turn if bound is not None else None
        if turn is not None and turn.query_id == query_id and turn.stored is not None and not turn.stored.done():
            turn.stored.set_result(None)

    def end_turn(self, sandbox_id: str, query_id: str) -> TurnSummary:
        bound = self._bound.get(sandbox_id)
        if bound is None or bound.turn is None or bound.turn.query_id != query_id:
            return TurnSummary()
        turn, bound.turn = bound.turn, None
        _refuse_held(turn)
        return TurnSummary(turn.calls, turn.model_ms, turn.spent)

    async def flush(self) -> None:
        """Store the records of every finished call (the audit list, a sandbox's detach, shutdown)."""
        await self._writer.flush()

    async def take_records(self, query_id: str) -> list[ModelCallRecord]:
        """The records of a turn's finished calls, for the turn to store with its end (`RecordWriter.take`)."""
        return await self._writer.take(query_id)

    def requeue(self, records: Sequence[ModelCallRecord]) -> None:
        """Records `take_records` gave that their turn could not store: stored like any other."""
        self._writer.put_back(records)

    # --- sockets ---------------------------------------------------------------------------------
    async def start_for(self, sandbox_id: str, socket_path: str | os.PathLike[str]) -> None:
        """Listen on `socket_path` for this sandbox. Idempotent per sandbox."""
        if sandbox_id in self._sites:
            return
        path = Path(socket_path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app[_SANDBOX_ID] = sandbox_id
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.UnixSite(runner, str(path)).start()
        # The sandbox user must be able to connect; the socket lives in its private run dir.
        os.chmod(path, 0o666)  # noqa: S103
        self._sites[sandbox_id] = (runner, path)

    async def stop_for(self, sandbox_id: str) -> None:
        entry = self._sites.pop(sandbox_id, None)
        self._keys.pop(sandbox_id, None)
        bound = self._bound.get(sandbox_id)
        if bound is not None and bound.turn is not None:
            _refuse_held(bound.turn)  # a call held for its prompt ends now, refused, not at the site's timeout
        if entry is not None:
            runner, path = entry
            await runner.cleanup()  # in-flight calls finish (or are cancelled) and record themselves
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._bound.pop(sandbox_id, None)
        with contextlib.suppress(Exception):  # logged by the writer, retried at the next flush
            await self._writer.flush()

    async def close(self) -> None:
        for sandbox_id in list(self._sites):
            await self.stop_for(sandbox_id)
        await self._writer.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- the call --------------------------------------------------------------------------------
    async def _key(self, sandbox_id: str, bound: _Bound) -> str | None:
        provider = self._keys.get(sandbox_id) or bound.binding.key or self._default_key
        if provider is None:
            return None
        value = provider()
        if inspect.isawaitable(value):
            value = await value
        return value or None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=UPSTREAM_CONNECT_TIMEOUT_S,
                                              sock_read=self._timeout),
            )
        return self._session

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sandbox_id = request.app[_SANDBOX_ID]
        bound = self._bound.get(sandbox_id)
        if bound is None:
            return self._refuse(None, None, Refusal(
                403, "permission_error", "no_session",
                "model proxy: this sandbox is not attached to a session, so it may not call the model"))
        b = bound.binding
        call = CallRecord(b.session_id, b.tenant, b.agent_name, sandbox_id,
                          ENDPOINTS.get(request.path, request.path[:64]))
        call.query_id = bound.turn.query_id if bound.turn else None
        if request.path not in ALLOWED_PATHS:
            return self._refuse(bound, call, Refusal(
                404, "not_found_error", "not_forwarded",
                f"model proxy: only {', '.join(sorted(ALLOWED_PATHS))} are forwarded, not {request.path[:200]}"))
        if request.method != "POST":
            return self._refuse(bound, call, Refusal(405, "invalid_request_error", "not_forwarded",
                                                     "model proxy: only POST is forwarded"))
        # The turn and the rate first: a sandbox that sends request after request gets cheap refusals,
        # and the bodies it may have parsed are bounded by the rate.
        refusal = self._gate(bound)
        if refusal is not None:
            return self._refuse(bound, call, refusal)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(bound, call, Refusal(
                413, "request_too_large", "invalid",
                f"model proxy: the request is larger than the model API's limit of {MAX_REQUEST_BYTES} bytes"))
        if len(raw) > PARSE_IN_THREAD_BYTES:  # a long conversation: keep the loop free for other sessions
            parsed = await asyncio.to_thread(parse_request, call.endpoint, raw)
        else:
            parsed = parse_request(call.endpoint, raw)
        if isinstance(parsed, Refusal):
            return self._refuse(bound, call, parsed)
        call.model, call.max_tokens, call.stream = parsed.model, parsed.max_tokens, parsed.stream
        refusal = self._check(bound, parsed)
        if refusal is not None:
            return self._refuse(bound, call, refusal)
        key = await self._key(sandbox_id, bound)
        if not key:
            return self._refuse(bound, call, Refusal(
                401, "authentication_error", "no_key",
                "no API key for this session: set ANTHROPIC_API_KEY on the server or give the session a credential"))
        refusal = await self._stored(sandbox_id, bound)
        if refusal is not None:
            return self._refuse(bound, call, refusal)
        if call.endpoint != "messages":
            return await self._forward(request, bound, call, parsed, key, 0.0)
        assert bound.turn is not None  # checked above
        assert parsed.max_tokens is not None  # parse_request requires it on /v1/messages
        admitted = await self._budgets.admit(bound.binding, bound.spend, bound.turn, parsed.model,
                                             parsed.input_estimate, parsed.max_tokens)
        if isinstance(admitted, Refusal):
            return self._refuse(bound, call, admitted)
        return await self._forward(request, bound, call, parsed, key, admitted)

    async def _stored(self, sandbox_id: str, bound: _Bound) -> Refusal | None:
        """Wait, where the turn's prompt is still being stored (`begin_turn(held=True)`), until it is:
        no call of a turn is forwarded before its prompt is stored. A refusal when the turn was
        withdrawn or ended meanwhile, or the sandbox let go."""
        turn = bound.turn
        if turn is None or turn.stored is None:
            return None
        if not turn.stored.done():  # withdrawn meanwhile (it fails), or no word in time: refused below
            with contextlib.suppress(_Withdrawn, TimeoutError):
                await asyncio.wait_for(asyncio.shield(turn.stored), HELD_CALL_WAIT_S)
        stored = turn.stored.done() and turn.stored.exception() is None
        if stored and bound.turn is turn and self._bound.get(sandbox_id) is bound:
            return None
        return Refusal(403, "permission_error", "no_turn",
                       "model proxy: the turn's message could not be stored, so its model calls are refused")

    def _gate(self, bound: _Bound) -> Refusal | None:
        """A running turn, and room in the session's request rate."""
        if bound.turn is None:
            return Refusal(403, "permission_error", "no_turn",
                           "model proxy: no turn is running in this session; the model can only be called "
                           "while the session is answering a message")
        if bound.rate is not None:
            wait = bound.rate.take()
            if wait is not None:
                return Refusal(429, "rate_limit_error", "rate",
                               f"model proxy: this session made more than {self.policy.rate_burst} model calls in a "
                               f"burst or {self.policy.rate_per_minute:g} a minute (SERVICE_MODEL_RATE_*); "
                               f"retry in {wait:.1f} s", retry_after=wait)
        return None

    def _check(self, bound: _Bound, req: ParsedRequest) -> Refusal | None:
        """The model and max_tokens of the request."""
        turn = bound.turn
        assert turn is not None  # _gate
        if not bound.binding.models.permits(req.model, turn.model, self.policy):
            allowed = ", ".join(dict.fromkeys([turn.model, *bound.binding.models.allowed, *self.policy.allow]))
            return Refusal(403, "permission_error", "model",
                           f"model proxy: model {req.model!r} is not allowed in this turn (allowed: {allowed}); "
                           "send the message with that `model`, list it in the agent's .agent/settings.json "
                           "`allowedModels`, or ask the operator to add it to SERVICE_MODEL_ALLOW")
        ceiling = self.policy.max_tokens
        if req.max_tokens is not None and ceiling is not None and req.max_tokens > ceiling:
            return Refusal(400, "invalid_request_error", "max_tokens",
                           f"model proxy: max_tokens {req.max_tokens} is above this server's ceiling of {ceiling} "
                           "(SERVICE_MODEL_MAX_TOKENS)")
        return None

    async def _forward(self, request: web.Request, bound: _Bound, call: CallRecord, req: ParsedRequest,
                       key: str, reserved: float) -> web.StreamResponse:
        turn = bound.turn
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        headers["x-api-key"] = key
        headers["accept-encoding"] = "identity"
        headers["content-type"] = "application/json"
        headers.update(self.route.request_headers)
        meter: UsageMeter | None = None
        status: int  # set with the meter, and read only with it
        gone = False
        broke: str | None = None
        try:
            try:
                upstream = await self._client().post(self.base_url + request.path_qs, data=req.body, headers=headers,
                                                     proxy=self.route.proxy, proxy_headers=self.route.proxy_headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.warning("model proxy: upstream %s unreachable (%s): %s", self.base_url, self.route.describe(), exc)
                call.status, call.outcome, call.reason = 502, "error", "upstream_unreachable"
                call.detail = f"model proxy could not reach the model API: {type(exc).__name__}"
                return web.json_response({"type": "error", "error": {"type": "api_error", "message": call.detail}},
                                         status=502)
            async with upstream:
                status = upstream.status
                meter = UsageMeter(upstream.content_type == "text/event-stream")
                resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in _DROP_RESPONSE:
                        resp.headers.add(name, value)
                # The headers go with the reply's first bytes, in one write: the bridge has nothing to
                # do with them alone, and each write wakes it (aiohttp holds them when told to).
                resp._send_headers_immediately = False
                try:
                    await resp.prepare(request)
                except ConnectionResetError:
                    gone = True
                try:
                    async for chunk in upstream.content.iter_any():
                        if call.first_byte is None:
                            call.first_byte = time.monotonic()
                        try:
                            if not gone:
                                try:
                                    await resp.write(chunk)
                                except ConnectionResetError:
                                    # The sandbox hung up (an interrupted query). Keep reading until the
                                    # API has reported the input tokens, so the call is billed, then stop.
                                    gone = True
                        finally:
                            # Metered once it is on its way (the sandbox reads it meanwhile), and also
                            # when the write failed or was cancelled: what the API sent is billed.
                            meter.feed(chunk)
                        if gone and meter.streaming and meter.started:
                            break  # (a JSON reply is complete already: it is read to its usage)
                except aiohttp.ClientError as exc:  # sock_read's timeout too (ServerTimeoutError)
                    broke = f"the model API's reply broke off: {type(exc).__name__}"
                    log.warning("model proxy: upstream stream broke: %s", exc)
                return resp  # aiohttp writes its end when the handler returns (for a sandbox gone it fails quietly)
        except asyncio.CancelledError:  # the proxy is stopping (sandbox gone, server shutdown)
            gone, broke = True, "the call was cut off when the sandbox's proxy stopped"
            raise
        finally:
            if meter is not None:
                meter.finish()
                call.metered(meter, status, gone, broke)
                call.cost_usd = self.policy.prices.cost(call.model or "", call.usage)
            elif call.ended is None:
                call.ended = time.monotonic()
            if turn is not None:
                turn.calls += 1
                turn.model_ms += call.latency_ms
            self._budgets.settle(bound.binding.tenant, bound.spend, turn, reserved, call.cost_usd)
            self._record(bound, call)

    # --- records and refusals --------------------------------------------------------------------
    def _record(self, bound: _Bound, call: CallRecord) -> None:
        if self._metrics is not None and call.outcome != "refused":
            self._metrics.model_call(call.model or "", call.outcome, metrics_usage(call.usage), call.cost_usd,
                                     call.latency_ms / 1000)
        self._writer.add(call.to_record(self._server_id))

    def _refuse(self, bound: _Bound | None, call: CallRecord | None, refusal: Refusal) -> web.Response:
        if self._metrics is not None:
            self._metrics.model_refusal((call.model if call else None) or "", refusal.reason)
        if bound is not None and call is not None:
            # A sandbox hammering the socket must not fill the database: a bounded number of rows.
            if bound.refusal_log.take() is None:
                note = f" ({bound.suppressed} more refusals not listed)" if bound.suppressed else ""
                bound.suppressed = 0
                call.refused(refusal, note)
                self._record(bound, call)
            else:
                bound.suppressed += 1
        return _error(refusal)

