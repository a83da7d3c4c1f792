"""A fake Anthropic Messages API for tests and offline development.

Speaks the real wire format (`POST /v1/messages`, streaming SSE or one JSON reply,
`POST /v1/messages/count_tokens`) and is driven by scripts; see `docs/fake-model.md`.

    python -m ashd.devtools.fake_model --port 8787

In-process:

    fake = FakeModel()
    url = await fake.start()                      # http://127.0.0.1:<free port>
    fake.script("tok-1", [{"content": [{"type": "text", "text": "hi"}]}])
    ...
    fake.requests                                 # [{"path", "headers", "header_list", "body"}, ...]
    await fake.stop()
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import threading
from typing import Any

from aiohttp import web

from ashd.devtools._fake_cache import MAX_BREAKPOINTS, PromptCache, count_breakpoints, flat_blocks
from ashd.devtools._fake_script import ScriptBook, estimate_input_tokens
from ashd.devtools._fake_stream import error_body, full_message, sse_events

DEFAULT_MODEL = "claude-fake-model"
ONE_WRITE_BYTES = 16 * 1024
# Run on its own (`python -m`, `scripts/fake_model`), the fake keeps the last this many requests: each
# holds its whole conversation, so a day of offline development kept them all grows without end.
CLI_KEEP_REQUESTS = 1000


class FakeModel:
    def __init__(self, keep_requests: int | None = None) -> None:
        """`keep_requests`: how many of the latest requests `requests` keeps (None: all of them)."""
        self.scripts = ScriptBook()
        self.cache = PromptCache()
        self._requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep_requests)
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- in-process API ----------------------------------------------------------------------
    def script(self, match: str, turns: list[dict[str, Any]], *, sequential: bool = False) -> None:
        """Register (or replace) the script selected by `match` (`sequential`: see _fake_script)."""
        self.scripts.register(match, turns, sequential)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def requests_containing(self, token: str) -> list[dict[str, Any]]:
        """Recorded requests whose body mentions `token` (isolates one test among many)."""
        return [r for r in self.requests if token in json.dumps(r["body"])]

    def reset(self) -> None:
        self.scripts.clear()
        self.cache.clear()
        with self._lock:
            self._requests.clear()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/_fake/scripts", self._post_script)
        app.router.add_get("/_fake/scripts", self._get_scripts)
        app.router.add_get("/_fake/requests", self._get_requests)
        app.router.add_delete("/_fake/requests", self._delete_requests)
        app.router.add_post("/_fake/reset", self._reset)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        assert getattr(server, "sockets", None)
        bound = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        self.url = f"http://{host}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ----------------------------------------------------------------------------
    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(error_body(400, "request body is not JSON"), status=400)
        self._record(request, body)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return web.json_response(error_body(400, "messages: field required"), status=400)
        blocks = flat_blocks(body)
        if (marks := count_breakpoints(body, blocks)) > MAX_BREAKPOINTS:
            message = f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}."
            return web.json_response(error_body(400, message), status=400)
        turn = self.scripts.pick(body)
        if turn.get("wait"):  # a slow first byte: nothing is sent back until then
            await asyncio.sleep(float(turn["wait"]))
        err = turn.get("error")
        if isinstance(err, dict):
            status = int(err.get("status", 500))
            headers = {}
            if err.get("retryAfter") is not None:
                headers["retry-after"] = str(err["retryAfter"])
            message = str(err.get("message") or f"fake error {status}")
            return web.json_response(error_body(status, message, err.get("type")), status=status, headers=headers)
        model = str(body.get("model") or DEFAULT_MODEL)
        tokens = self.cache.account(body, estimate_input_tokens(body), blocks)
        if not body.get("stream"):
            return web.json_response(full_message(turn, model, tokens))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        delay = float(turn.get("delay") or 0)
        events = [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                  for name, data in sse_events(turn, model, tokens)]
        if not delay and sum(map(len, events)) <= ONE_WRITE_BYTES:
            # A short instant reply is there at once, as one write: the headers, the events and the
            # chunked body's end in one segment on the wire, as an instant model's would come
            # (aiohttp holds a StreamResponse's headers for its first write when told to; without
            # that, three writes and three wake-ups of the reader). A long one is streamed event
            # by event, its headers first, as the API does.
            resp._send_headers_immediately = False
            await resp.prepare(request)
            await resp.write_eof(b"".join(events))
            return resp
        await resp.prepare(request)
        for event in events:
            if delay:
                await asyncio.sleep(delay)
            await resp.write(event)
        await resp.write_eof()
        return resp

    def _record(self, request: web.Request, body: Any) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        # Every header line as sent, repeats included (`headers` keeps the last of a repeated name).
        header_list = [[k.lower(), v] for k, v in request.headers.items()]
        with self._lock:
            self._requests.append({"path": request.path_qs, "headers": headers, "header_list": header_list,
                                   "body": body})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        return web.json_response({"input_tokens": estimate_input_tokens(body)})

    async def _post_script(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            self.scripts.register(str(data.get("match") or ""), data.get("turns"), bool(data.get("sequential")))
        except (ValueError, AttributeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True}, status=201)

    async def _get_scripts(self, request: web.Request) -> web.Response:
        return web.json_response({"scripts": self.scripts.listing()})

    async def _get_requests(self, request: web.Request) -> web.Response:
        token = request.query.get("contains")
        rows = self.requests_containing(token) if token else self.requests
        return web.json_response({"requests": rows})

    async def _delete_requests(self, request: web.Request) -> web.Response:
        with self._lock:
            self._requests.clear()
        return web.json_response({"ok": True})

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ashd.devtools.fake_model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--keep-requests", type=int, default=CLI_KEEP_REQUESTS,
                        help="the latest requests kept for GET /_fake/requests (0: all)")
    args = parser.parse_args(argv)
    fake = FakeModel(keep_requests=args.keep_requests if args.keep_requests > 0 else None)
    print(f"fake Messages API on http://{args.host}:{args.port}", flush=True)
    web.run_app(fake.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
