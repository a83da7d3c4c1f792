"""What the per-sandbox model proxy adds to a model call: per call and per streamed chunk.

    .venv/bin/python scripts/bench_model_proxy.py [--calls 300] [--chunks 2000] [--runs 5]

A minimal upstream (pre-rendered bytes, no work per request) answers on loopback TCP; the same
requests go once straight to it and once through a `ModelProxy` on a Unix socket. Reported:
- small JSON call: wall latency p50/p99 direct vs proxied, and CPU time per call;
- a 1 MB request body (a long conversation): the same;
- a stream of N SSE chunks, each written and flushed on its own: wall time, and CPU time per chunk;
- the usage meter's own CPU time per chunk (the part of the per-chunk cost that metering adds).
Both clients are aiohttp. Upstream, proxy and client share this process, so the CPU added per call
or chunk is the proxy's work (parse, policy, forward, meter, record) and barely moves when the
machine is busy; wall times do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

MODEL = "claude-bench-model"
USAGE = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
REPLY = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": USAGE}).encode()


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def stream_chunks(n: int) -> list[bytes]:
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                  "model": MODEL, "content": [], "stop_reason": None,
                                                  "stop_sequence": None, "usage": USAGE}}
    chunks = [sse("message_start", start),
              sse("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})]
    delta = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": "token "}})
    chunks += [delta] * n
    chunks += [sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
               sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                     "usage": {"output_tokens": n}}),
               sse("message_stop", {"type": "message_stop"})]
    return chunks


async def upstream(chunks: list[bytes]) -> tuple[web.AppRunner, str]:
    async def messages(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream": true' not in body and b'"stream":true' not in body:
            return web.Response(body=REPLY, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def start_proxy(url: str, socket: Path) -> Any:
    from ashd.sandboxing._model_proxy import ModelProxy

    try:
        from ashd.sandboxing._model_policy import ModelBinding, ModelPolicy, SessionModels
    except ImportError:  # the proxy before metering (main): forward only
        proxy = ModelProxy(url, default_key=lambda: "sk-bench")
        await proxy.start_for("sb-bench", socket)
        return proxy

    async def store(records: Any) -> None:  # a database stand-in: the records are built and queued
        pass

    async def spend(*_: Any) -> float:
        return 0.0

    # Every check on (model, max_tokens, rate, three budgets) with limits the benchmark never reaches.
    policy = ModelPolicy(rate_per_minute=1e9, rate_burst=10**9, session_budget_usd=1e9, tenant_budget_usd=1e9)
    proxy = ModelProxy(url, default_key=lambda: "sk-bench", policy=policy, store=store, session_spend=spend,
                       tenant_spend=spend)
    await proxy.start_for("sb-bench", socket)
    proxy.bind("sb-bench", ModelBinding("s-bench", "bench", "bench", SessionModels(MODEL, ())))
    proxy.begin_turn("sb-bench", "q-bench", None, 1e9)
    return proxy


async def timed_post(client: aiohttp.ClientSession, url: str, payload: bytes) -> float:
    t0 = time.perf_counter()
    async with client.post(url, data=payload, headers={"content-type": "application/json"}) as resp:
        async for _ in resp.content.iter_any():
            pass
        assert resp.status == 200, resp.status
    return (time.perf_counter() - t0) * 1000


async def series(client: aiohttp.ClientSession, url: str, payload: bytes, n: int) -> tuple[list[float], float]:
    """Wall times (ms) of n calls, and the process CPU time per call (ms): upstream, proxy and client
    all run in this process, so the CPU difference between proxied and direct is the proxy's work,
    and it is far less disturbed by other load on the machine than wall time."""
    for _ in range(min(20, n)):  # warm the connection pools
        await timed_post(client, url, payload)
    cpu = time.process_time()
    walls = [await timed_post(client, url, payload) for _ in range(n)]
    return walls, (time.process_time() - cpu) * 1000 / n


def meter_cost(n: int) -> None:
    """CPU time of the usage meter alone, per streamed chunk (each SSE event fed as its own chunk)."""
    try:
        from ashd.sandboxing._model_meter import UsageMeter
    except ImportError:
        return
    chunks = stream_chunks(n)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        meter = UsageMeter(streaming=True)
        for chunk in chunks:
            meter.feed(chunk)
        meter.finish()
        best = min(best, time.perf_counter() - t0)
    assert meter.usage["output_tokens"] == n
    print(f"usage meter alone  {best * 1e6 / len(chunks):.2f} us per chunk (best of 5)")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int, chunks: int, runs: int) -> None:
    runner, url = await upstream(stream_chunks(chunks))
    tmp = Path(tempfile.mkdtemp(prefix="ashd-bmp-", dir="/tmp"))
    proxy = await start_proxy(url, tmp / "model.sock")
    direct = aiohttp.ClientSession()
    proxied = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(tmp / "model.sock")))
    small = json.dumps({"model": MODEL, "max_tokens": 1024,
                        "messages": [{"role": "user", "content": "hi"}]}).encode()
    big = json.dumps({"model": MODEL, "max_tokens": 1024, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "lorem ipsum dolor sit amet " * 40}
        for i in range(950)]}).encode()
    streamed = json.dumps({"model": MODEL, "max_tokens": 1024, "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        (d, dc), (p, pc) = (await series(direct, url + "/v1/messages", small, calls),
                            await series(proxied, "http://proxy/v1/messages", small, calls))
        print(f"small JSON call: wall p50 direct {pct(d, .5):.3f} ms, proxied {pct(p, .5):.3f} ms (p99 "
              f"{pct(d, .99):.3f} / {pct(p, .99):.3f}) | CPU per call direct {dc:.3f} ms, proxied {pc:.3f} ms, "
              f"added {pc - dc:.3f} ms")
        n = max(20, calls // 10)
        (d, dc), (p, pc) = (await series(direct, url + "/v1/messages", big, n),
                            await series(proxied, "http://proxy/v1/messages", big, n))
        print(f"{len(big) / 1e6:.2f} MB request: wall p50 direct {pct(d, .5):.3f} ms, proxied {pct(p, .5):.3f} ms | "
              f"CPU per call direct {dc:.3f} ms, proxied {pc:.3f} ms, added {pc - dc:.3f} ms")
        (d, dc), (p, pc) = (await series(direct, url + "/v1/messages", streamed, runs),
                            await series(proxied, "http://proxy/v1/messages", streamed, runs))
        dm, pm = statistics.median(d), statistics.median(p)
        print(f"stream of {chunks} chunks: wall median direct {dm:.1f} ms, proxied {pm:.1f} ms | CPU per chunk "
              f"direct {dc * 1000 / chunks:.2f} us, proxied {pc * 1000 / chunks:.2f} us, added "
              f"{(pc - dc) * 1000 / chunks:.2f} us")
        meter_cost(chunks)
    finally:
        await direct.close()
        await proxied.close()
        await proxy.close()
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.chunks, args.runs))
