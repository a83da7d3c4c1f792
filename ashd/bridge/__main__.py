"""`python -m ashd.bridge --socket /run/ashd/bridge.sock [--model-socket ...] [--workspace ...]`.

`main(argv)` is also what a fork server (zygote) calls after pre-importing the model client and
engine. Imports stay light at module level: the engine modules are imported when `main` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys

# Imported lazily by the engine (the HTTP stack of the model client on the first request, the MCP
# client when servers are configured). The fork server imports them once, so sandboxes do not.
ZYGOTE_PRELOAD = (
    "anyio._backends._asyncio",
    "h11",
    "httpcore2",
    "httpcore2._async.connection_pool",
    "httpcore2._backends.anyio",
    "truststore",
    "mcp",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "mcp.client.sse",
    "ashd.bridge._reaper",
)

# The most a socket or pipe read takes at once. asyncio's own, 256 KiB, is above glibc's mmap
# threshold (128 KiB): each read then maps a fresh buffer, faults it in, shrinks and unmaps it
# (15 µs a read on this machine kind against under 3 for 64 KiB; docs/performance.md, twenty-ninth
# pass). The bridge reads each query, each model reply and each tool's output this way.
READ_BYTES = 64 * 1024


def zygote_warm() -> None:
    """Called once by the fork server after the preloads: the model client's first-request work,
    then the argument parser and the log handler every bridge would otherwise build for itself."""
    from ashd.bridge._warm import warm

    warm()
    # Built here, each child only uses them. Built in each child they cost a sandbox's start about
    # 200 more copy-on-write page faults and 3.7 ms of CPU on a slow host (docs/performance.md,
    # twenty-sixth pass).
    _parser()
    _configure_logging("INFO")
    small_reads()


def small_reads() -> None:
    """Reads of at most `READ_BYTES` on asyncio's socket and pipe transports (set in the fork
    server, so that its children find it set and write nothing)."""
    from asyncio import selector_events, unix_events

    for transport in (selector_events._SelectorSocketTransport,  # type: ignore[attr-defined]
                      unix_events._UnixReadPipeTransport):  # type: ignore[attr-defined]
        if transport.max_size != READ_BYTES:
            transport.max_size = READ_BYTES


@functools.cache
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ashd.bridge", description="ashd in-sandbox bridge")
    parser.add_argument("--socket", default="/run/ashd/bridge.sock", help="Unix socket to listen on")
    parser.add_argument("--listen-fd", type=int, default=None,
                        help="an inherited socket already listening at --socket (the launcher's): serve on it")
    parser.add_argument("--model-socket", default="/run/ashd/model.sock", help="the server's model proxy socket")
    parser.add_argument("--workspace", default="/workspace", help="the agent's working directory")
    parser.add_argument("--log-level", default="INFO")
    return parser


def _configure_logging(level_name: str) -> None:
    """The bridge's log lines on stderr (the sandbox's log file); a fork server's child finds the
    handler made by `zygote_warm` and changes a level only where it differs: `setLevel` clears
    every logger's cache, a write to each of them."""
    level = logging.getLevelName(level_name.upper())
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s bridge %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        # httpx2/mcp are chatty at INFO (one line per request); keep the bridge log about the bridge.
        for noisy in ("httpx", "httpx2", "mcp"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    want = level if isinstance(level, int) else logging.INFO
    if root.level != want:
        root.setLevel(want)


async def _serve(args: argparse.Namespace) -> int:
    from ashd.bridge._server import BridgeServer

    server = BridgeServer(args.socket, args.model_socket or None, args.workspace, args.listen_fd)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    reaper = None
    if os.getpid() == 1:  # its sandbox's init (the zygote route): the orphans are ours to reap
        from ashd.bridge._reaper import OrphanReaper

        reaper = OrphanReaper(loop)
        reaper.install()
    from ashd.bridge._warm import warm_when_idle

    # The first turn's page copies, made while a spare waits for its session (ashd/bridge/_warm.py).
    warming = loop.create_task(warm_when_idle(lambda: server.engine is None, server.connected))
    try:
        return await server.serve()
    finally:
        warming.cancel()
        if reaper is not None:
            reaper.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(str(args.log_level))
    small_reads()
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
