"""The bridge's Messages API client against a real HTTP server on a unix socket, as the model proxy
serves it: what it sends, how it reads a stream, and how each failure reaches the person."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ashd.bridge.engine._model import ModelError, PromptTooLong, call_model, make_client
from ashd.bridge.engine._model_client import encode_request, encoded_list

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
START = {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "model": "x",
                                              "content": [], "stop_reason": None, "usage": {"input_tokens": 3}}}
PARAMS = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hé"}]}


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/messages", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        path = str(tmp_path / f"model{len(runners)}.sock")
        await web.UnixSite(runner, path).start()
        runners.append(runner)
        return path

    yield start
    for runner in runners:
        await runner.cleanup()


def event(data: dict[str, Any], name: str | None = None) -> bytes:
    return f"event: {name or data['type']}\ndata: {json.dumps(data)}\n\n".encode()


async def failure(socket: str, *, retries: int = 0, on_event: Any = None) -> ModelError:
    """The ModelError a call through `socket` ends with (the client closed after)."""
    client = make_client(socket)
    try:
        with pytest.raises(ModelError) as failed:
            await call_model(client, PARAMS, betas=[], on_event=on_event, max_retries=retries)
    finally:
        await client.close()
    return failed.value


def streaming(*chunks: bytes, abort: bool = False) -> Handler:
    """A handler answering with an event stream of `chunks`, then its end (or a cut connection)."""

    async def handler(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        for chunk in chunks:
            await resp.write(chunk)
        if abort:
            assert req.transport is not None
            req.transport.abort()
        else:
            await resp.write_eof()
        return resp

    return handler


async def test_a_stream_is_sent_as_the_api_wants_it_and_read_into_the_final_message(serve: Any) -> None:
    seen: list[tuple[dict[str, str], Any]] = []

    async def handler(req: web.Request) -> web.StreamResponse:
        seen.append((dict(req.headers), await req.json()))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        # Split across writes mid-line, a ping, a data field without its space, CRLF line ends.
        body = (event(START) + b"event: ping\ndata: {\"type\": \"ping\"}\n\n"
                + event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
                + b'event:content_block_delta\r\ndata:{"type":"content_block_delta","index":0,'
                  b'"delta":{"type":"text_delta","text":"he"}}\r\n\r\n'
                + event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "llo"}})
                + event({"type": "content_block_stop", "index": 0})
                + event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}})
                + event({"type": "message_stop"}))
        for i in range(0, len(body), 37):
            await resp.write(body[i:i + 37])
        await resp.write_eof()
        return resp

    client = make_client(await serve(handler))
    events: list[dict[str, Any]] = []

    async def on_event(ev: dict[str, Any]) -> None:
        events.append(ev)

    try:
        result = await call_model(client, PARAMS, betas=["b1", "b2"], on_event=on_event, max_retries=0)
    finally:
        await client.close()
    headers, body = seen[0]
    assert body == {**PARAMS, "stream": True}
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "b1,b2"
    assert headers["x-api-key"] == "sandbox-no-key"  # the proxy puts the real key in; the sandbox has none
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                           "content_block_delta", "content_block_stop", "message_delta",
                                           "message_stop"]
    assert result.message["content"] == [{"type": "text", "text": "hello"}]
    assert result.message["stop_reason"] == "end_turn"
    assert result.message["usage"] == {"input_tokens": 3, "output_tokens": 2}


async def test_an_error_event_mid_stream_is_told_with_the_apis_words(serve: Any) -> None:
    error = event({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    failed = await failure(await serve(streaming(event(START), error)))
    assert str(failed) == "model API overloaded (529): Overloaded"


async def test_a_refused_request_says_why_and_is_retried_only_when_worth_it(serve: Any) -> None:
    calls: list[int] = []

    async def handler(req: web.Request) -> web.StreamResponse:
        calls.append(1)
        if len(calls) == 1:
            return web.json_response({"type": "error", "error": {"type": "api_error", "message": "hiccup"}},
                                     status=500, headers={"retry-after": "0"})
        return web.json_response({"type": "error", "error": {
            "type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"}},
            status=400)

    failed = await failure(await serve(handler), retries=2)
    assert isinstance(failed, PromptTooLong)
    assert len(calls) == 2  # the 500 was retried, the 400 was not
    assert "prompt is too long: 250000 tokens" in str(failed)


async def test_the_servers_own_refusal_is_passed_on_as_it_is(serve: Any) -> None:
    async def handler(req: web.Request) -> web.StreamResponse:
        return web.json_response({"type": "error", "error": {"type": "permission_error", "message": (
            "this session's maxBudgetUsd is spent")}}, status=403, headers={"x-ashd-refusal": "turn_budget"})

    failed = await failure(await serve(handler), retries=3)
    assert failed.refusal == "turn_budget"
    assert str(failed) == "model call refused by the server (403): this session's maxBudgetUsd is spent"


async def test_a_body_that_is_not_json_is_still_told(serve: Any) -> None:
    async def handler(req: web.Request) -> web.StreamResponse:
        return web.Response(text="upstream gateway broke", status=401)

    failed = await failure(await serve(handler))
    assert str(failed).startswith("model API rejected the API key (401)")


async def test_a_stream_that_is_not_json_fails_the_call_and_says_so(serve: Any) -> None:
    broken = b"event: content_block_start\ndata: {not json\n\n"
    failed = await failure(await serve(streaming(event(START), broken)))
    assert "model API call failed" in str(failed) and "not JSON" in str(failed)


async def test_no_model_proxy_is_told_as_unreachable(tmp_path: Path) -> None:
    failed = await failure(str(tmp_path / "absent.sock"))
    assert str(failed).startswith("could not reach the model API: Connection error")


async def test_a_connection_cut_mid_stream_is_unreachable_and_not_retried_after_events(serve: Any) -> None:
    calls: list[int] = []
    cut = streaming(event(START), abort=True)

    async def handler(req: web.Request) -> web.StreamResponse:
        calls.append(1)
        return await cut(req)

    seen: list[dict[str, Any]] = []

    async def on_event(ev: dict[str, Any]) -> None:
        seen.append(ev)

    failed = await failure(await serve(handler), retries=3, on_event=on_event)
    assert len(calls) == 1 and [e["type"] for e in seen] == ["message_start"]  # sent on: no retry
    assert str(failed).startswith("could not reach the model API")


async def test_the_message_is_whole_at_message_stop_without_waiting_for_the_bodys_end(serve: Any) -> None:
    """What follows `message_stop` is the body's framing: a reply whose last chunk is slow to come
    (the model proxy records the call before it ends the body) is not waited for."""
    release = asyncio.Event()

    async def handler(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(req)
        await resp.write(event(START) + event({"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": "done"}})
                         + event({"type": "content_block_stop", "index": 0})
                         + event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
                         + event({"type": "message_stop"}))
        await release.wait()  # the body's end would come only after the test is over
        await resp.write_eof()
        return resp

    client = make_client(await serve(handler))
    try:
        result = await asyncio.wait_for(call_model(client, PARAMS, betas=[], on_event=None, max_retries=0), 10)
    finally:
        release.set()
        await client.close()
    assert result.message["content"] == [{"type": "text", "text": "done"}]
    assert result.message["stop_reason"] == "end_turn"


async def test_the_reply_left_at_message_stop_is_closed_by_the_call_not_by_the_garbage_collector(serve: Any) -> None:
    """asyncio closes an unfinished async generator that is collected with a task it schedules
    thread-safely (the loop's self-pipe written, the loop woken): the reply's line reader, left at
    `message_stop`, is closed by the call that left it, before the message is handed on."""
    collected: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen: Any) -> None:
        collected.append(agen.__qualname__)
        if hooks.finalizer is not None:
            hooks.finalizer(agen)

    client = make_client(await serve(streaming(
        event(START), event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "ok"}}),
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}), event({"type": "message_stop"}))))
    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)  # generators made from now on
    try:
        for _ in range(3):
            result = await call_model(client, PARAMS, betas=[], on_event=None, max_retries=0)
            assert result.message["content"] == [{"type": "text", "text": "ok"}]
        gc.collect()
        await asyncio.sleep(0)
    finally:
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)
        await client.close()
    assert collected == []


def test_a_request_with_encoded_tools_is_the_json_of_the_same_request() -> None:
    tools = [{"name": "Read", "description": "reads «files»", "input_schema": {"type": "object"}},
             {"name": "Bash", "description": "runs", "input_schema": {"type": "object", "properties": {}}}]
    params = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hé"}],
              "tools": encoded_list(tools), "stream": True}
    plain = {**params, "tools": list(tools)}
    assert json.loads(encode_request(params)) == plain
    assert encode_request(params) == encode_request(plain)  # byte for byte: the same text on the wire


WHOLE = (event(START) + event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "ok"}})
         + event({"type": "content_block_stop", "index": 0})
         + event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}) + event({"type": "message_stop"}))


async def _raw_proxy(path: str, answer: Callable[[int], bool], hold: asyncio.Event | None = None,
                     connections: list[int] | None = None) -> tuple[asyncio.Server, list[int]]:
    """A model proxy on `path` that reads each request and answers it when `answer(its number)`,
    else closes the connection without a byte (a proxy that closed the connection as it came).
    `hold`: each answer waits for it to be set; `connections`: one entry per connection accepted."""
    requests: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            connections.append(1)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            writer.close()
            return  # an opened-ahead connection the client closed unused
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        requests.append(len(requests) + 1)
        if hold is not None:
            await hold.wait()
        if answer(len(requests)):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"content-length: %d\r\n\r\n" % len(WHOLE) + WHOLE)
            await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(on_connection, path), requests


async def test_a_call_goes_on_a_connection_opened_ahead_and_a_proxy_restarted_meanwhile_is_reached_anew(
        tmp_path: Path) -> None:
    path = str(tmp_path / "model.sock")
    seen: list[int] = []
    answer = streaming(WHOLE)

    async def handler(req: web.Request) -> web.StreamResponse:
        seen.append(1)
        return await answer(req)

    async def proxy() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/messages", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, path).start()
        return runner

    runner = await proxy()
    client = make_client(path)
    try:
        client.preconnect()
        await asyncio.sleep(0.05)
        spare = client._unix._spare  # type: ignore[union-attr]
        assert spare is not None and spare.done() and not spare.result()[0].at_eof()  # open, no request yet
        first = await call_model(client, PARAMS, betas=[], on_event=None, max_retries=0)
        await asyncio.sleep(0.05)
        # The proxy stops and starts again on the same socket: the connection opened ahead after
        # the first call is closed with it, and the next call goes on a new one.
        await runner.cleanup()
        runner = await proxy()
        await asyncio.sleep(0.05)
        second = await call_model(client, PARAMS, betas=[], on_event=None, max_retries=0)
    finally:
        await client.close()
        await runner.cleanup()
    assert first.message["content"] == second.message["content"] == [{"type": "text", "text": "ok"}]
    assert len(seen) == 2


async def test_an_opened_ahead_connection_closed_unanswered_sends_the_call_again_on_a_new_one(
        tmp_path: Path) -> None:
    server, requests = await _raw_proxy(str(tmp_path / "model.sock"), lambda n: n > 1)
    client = make_client(str(tmp_path / "model.sock"))
    try:
        client.preconnect()
        result = await call_model(client, PARAMS, betas=[], on_event=None, max_retries=0)
    finally:
        await client.close()
        server.close()
    assert result.message["content"] == [{"type": "text", "text": "ok"}]
    assert requests == [1, 2]


async def test_a_new_connection_closed_unanswered_is_not_sent_again(tmp_path: Path) -> None:
    """Only a connection opened ahead may have been closed before the call reached the proxy; on a
    new one, the proxy had the call, and what it did with it is not known."""
    server, requests = await _raw_proxy(str(tmp_path / "model.sock"), lambda n: n > 1)
    try:
        failed = await failure(str(tmp_path / "model.sock"))
    finally:
        server.close()
    assert str(failed).startswith("could not reach the model API") and requests == [1]


async def test_a_call_that_ends_after_its_client_closed_opens_no_connection_ahead(tmp_path: Path) -> None:
    """A bridge closes its engine mid-turn when it is initialised anew or shuts down: the call under
    way ends, and opens nothing that no call would ever take."""
    connections: list[int] = []
    release = asyncio.Event()
    server, _ = await _raw_proxy(str(tmp_path / "model.sock"), lambda n: True, release, connections)
    client = make_client(str(tmp_path / "model.sock"))
    try:
        call = asyncio.ensure_future(call_model(client, PARAMS, betas=[], on_event=None, max_retries=0))
        while not connections:
            await asyncio.sleep(0.01)
        await client.close()
        release.set()
        result = await call
        await asyncio.sleep(0.05)
    finally:
        server.close()
    assert result.message["content"] == [{"type": "text", "text": "ok"}]
    assert connections == [1]  # without the closed flag, the call's end opened a second
