"""The bridge's socket server: one server connection at a time, commands dispatched to the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ashd import __version__
from ashd.bridge import protocol as p
from ashd.bridge._exec import run_exec
from ashd.bridge._setup import SetupFailed, mark_setup_done, run_setup
from ashd.bridge.engine import AnyEngine, Engine, EngineConfig, EngineError, QueryOptions, make_engine

log = logging.getLogger(__name__)
# How long a tool call waits for the server's limits_report before going on without one.
LIMITS_CHECK_TIMEOUT = 30.0


class BridgeServer:
    def __init__(self, socket_path: str, model_socket: str | None, workspace: str,
                 listen_fd: int | None = None) -> None:
        self.socket_path = socket_path
        # A socket the launcher bound and listens on, inherited (socket activation): the server can
        # connect and send before this process runs, and owns the path (docs/protocol.md).
        self.listen_fd = listen_fd
        self.model_socket = model_socket
        self.workspace = Path(workspace)
        self.engine: AnyEngine | None = None
        self.conn: Connection | None = None
        self._stop = asyncio.Event()
        self.connected = asyncio.Event()  # the first connection came (the server's, or its warmer's)

    def _listen(self) -> socket.socket:
        if self.listen_fd is not None:
            listener = socket.socket(fileno=self.listen_fd)
            if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
                listener.detach()
                raise SystemExit(f"--listen-fd {self.listen_fd} is not a Unix stream socket")
            return listener
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket from an earlier bridge
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        listener.listen(4)
        return listener

    async def serve(self) -> int:
        listener = self._listen()
        listener.setblocking(False)
        log.info("bridge listening on %s (pid %d%s)", self.socket_path, os.getpid(),
                 ", inherited" if self.listen_fd is not None else "")
        accept = asyncio.create_task(self._accept(listener))
        try:
            await self._stop.wait()
        finally:
            accept.cancel()
            await asyncio.wait([accept], timeout=1)  # unregister the accept before closing its fd
            if self.engine is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.engine.close(), 10)
            if self.conn is not None:
                await self.conn.close()
            listener.close()
            if self.listen_fd is None:  # an inherited socket's path is the launcher's
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.socket_path)
        return 0

    def stop(self) -> None:
        self._stop.set()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            if self.conn is not None:
                log.info("a new server connection replaces the old one")
                await self.conn.close()
            self.conn = Connection(self, sock)
            self.conn.start()

    async def log_event(self, level: str, message: str) -> None:
        getattr(log, level if level in ("debug", "info", "warning", "error") else "info")("%s", message)
        conn = self.conn
        if conn is not None:
            await conn.send_quiet(p.make(p.LOG, level=level, message=message))


    async def setup_line(self, stream: str, step: str, text: str) -> None:
        """One line of the agent's setup, to the server only: it stores them as the session's setup
        output. Not written to the bridge's own log (stderr), which the server keeps too."""
        conn = self.conn
        if conn is not None:
            level = "warning" if stream == "stderr" else "info"
            await conn.send_quiet(p.make(p.LOG, level=level, message=text, source="setup", stream=stream,
                                         step=step))


class Connection:
    def __init__(self, server: BridgeServer, sock: socket.socket) -> None:
        sock.setblocking(False)
        p.shrink_buffers(sock)
        self.server = server
        self.sock = sock
        self.reader = p.FrameReader(sock)
        self.writer = p.FrameWriter(sock)
        self.greeted = False
        server.connected.set()
        self.protocol = 1
        self.queries: dict[str, asyncio.Task[None]] = {}
        self.interrupt_reasons: dict[str, str] = {}  # query id -> why the server interrupted it
        # The last query's id and what puts the engine's conversation back as it was before it.
        self._undo: tuple[str, Callable[[], None]] | None = None
        self._withdrawn: set[str] = set()  # running queries withdrawn: put back once they unwound
        self._checks: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self._check_seq = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._main: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._main = asyncio.create_task(self._run())

    async def close(self) -> None:
        current = asyncio.current_task()
        for task in [self._main, *self.tasks]:
            if task is not None and task is not current and not task.done():
                task.cancel()
        pending = [t for t in [self._main, *self.tasks] if t is not None and t is not current]
        if pending:
            await asyncio.wait(pending, timeout=5)
        p.close_socket(self.sock, self.reader, self.writer)
        if self.server.conn is self:
            self.server.conn = None

    async def send(self, frame: p.Frame) -> None:
        await self.writer.write(frame)

    async def send_quiet(self, frame: p.Frame) -> None:
        with contextlib.suppress(OSError):
            await self.writer.write(frame)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _run(self) -> None:
        try:
            while True:
                try:
                    frame = await self.reader.read()
                except p.FrameTooLarge as exc:
                    await self.send(p.make(p.ERROR, error=f"frame refused: {exc}"))
                    continue
                except p.ProtocolError as exc:
                    await self.send(p.make(p.ERROR, error=f"bad frame: {exc}"))
                    continue
                if frame is None:
                    break
                await self._dispatch(frame)
        except OSError as exc:
            log.info("server connection lost: %s", exc)
        finally:
            for task in list(self.tasks):
                task.cancel()
            if self.server.conn is self:
                self.server.conn = None
            p.close_socket(self.sock, self.reader, self.writer)

    async def _dispatch(self, frame: p.Frame) -> None:
        kind = frame["type"]
        fid = frame.get("id")
        fid = str(fid) if fid is not None else None
        if kind == p.HELLO:
            await self._hello(frame)
            return
        if not self.greeted:
            await self.send(p.make(p.ERROR, id=fid, error="protocol: send hello before any other command"))
            return
        if kind == p.PING:
            await self.send(p.make(p.PONG, id=fid))
        elif kind == p.INIT:
            self._spawn(self._init(fid, frame.get("config") or {}))
        elif kind == p.QUERY:
            if fid is None:
                await self.send(p.make(p.ERROR, error="protocol: query needs an id"))
                return
            self.queries[fid] = self._spawn(self._query(fid, frame))
        elif kind == p.INTERRUPT:
            task = self.queries.get(fid or "")
            if task is not None and not task.done():
                reason = frame.get("reason")
                if isinstance(reason, str) and reason:
                    self.interrupt_reasons[fid or ""] = reason[:200]
                # Once the query's task has taken its first step: cancelled before it ran (its query
                # and this interrupt came in one read), it would never run its body, and so never
                # send the `error` and `done` its server waits for.
                asyncio.get_running_loop().call_soon(task.cancel)
        elif kind == p.WITHDRAW:
            self._withdraw(fid or "")
        elif kind == p.EXEC:
            self._spawn(self._exec(fid, frame))
        elif kind == p.SHUTDOWN:
            log.info("shutdown requested")
            self.server.stop()
        elif kind == p.LIMITS_REPORT:
            waiter = self._checks.pop(str(frame.get("checkId")), None)
            if waiter is not None and not waiter.done():
                notices = frame.get("notices")
                waiter.set_result([n for n in notices if isinstance(n, dict)] if isinstance(notices, list) else [])
        elif fid is not None:
            await self.send(p.make(p.ERROR, id=fid, error=f"protocol: unknown command type {kind!r}"))

    def _withdraw(self, fid: str) -> None:
        """The server could not store the prompt of query `fid`, sent ahead of its storing: end it
        and leave it out of the conversation. It was the last query sent (the server sends no other
        query between a query and its withdrawal), running or already ended."""
        log.info("query %s withdrawn: the server could not store its prompt", fid)
        task = self.queries.get(fid)
        if task is not None and not task.done():
            self._withdrawn.add(fid)  # `_query` puts the conversation back once the query unwound
            task.cancel()
            # (Cancelled before it started, with the query in the same read: it never ran, the
            # engine never saw it, and only this is left to clear.)
            task.add_done_callback(lambda _: self._forget(fid))
        elif self._undo is not None and self._undo[0] == fid:
            self._undo[1]()
            self._undo = None

    def _forget(self, fid: str) -> None:
        self.queries.pop(fid, None)
        self._withdrawn.discard(fid)

    async def _hello(self, frame: p.Frame) -> None:
        offered = frame.get("protocols") or [frame.get("protocol")]
        common = [v for v in p.SUPPORTED_VERSIONS if v in offered]
        if not common:
            await self.send(
                p.make(
                    p.ERROR,
                    error=(f"protocol: unsupported version {offered}; this bridge speaks {list(p.SUPPORTED_VERSIONS)}"),
                )
            )
            return
        self.greeted = True
        self.protocol = max(common)
        await self.send(
            p.make(
                p.READY,
                protocol=max(common),
                pid=os.getpid(),
                bridgeVersion=__version__,
                capabilities=["init", "query", "interrupt", "exec", "shutdown", "ping", "log"],
            )
        )

    async def _init(self, fid: str | None, config: dict[str, Any]) -> None:
        server = self.server
        try:
            cfg = EngineConfig.from_init(config, server.workspace, server.model_socket)
            mark_after = False
            if config.get("runSetup"):
                lines = config.get("setupLogLines")
                mark_after = await run_setup(server.workspace, cfg.tool_env, config.get("setupTimeout"),
                                             server.setup_line, lines if isinstance(lines, int) else None)
            engine = make_engine(cfg, server.log_event)
            await engine.start()
        except SetupFailed as exc:
            await self.send_quiet(p.make(p.ERROR, id=fid, error=str(exc)))
            return
        except Exception as exc:
            log.exception("init failed")
            await self.send_quiet(p.make(p.ERROR, id=fid, error=f"init failed: {type(exc).__name__}: {exc}"))
            return
        old, server.engine = server.engine, engine
        if old is not None:
            await old.close()
        await self.send_quiet(
            p.make(
                p.INIT_OK,
                id=fid,
                sessionId=engine.session_id,
                model=cfg.default_model(),
                mcpServers=engine.mcp.status(),
                withdraw=True if isinstance(engine, Engine) else None,  # (the SDK engine's conversation is its CLI's)
            )
        )
        if mark_after:  # no setup step: the home is marked off the create's path (`run_setup`)
            try:
                mark_setup_done()
            except OSError:
                log.exception("could not mark the sandbox home's setup as done")

    async def _query(self, fid: str, frame: p.Frame) -> None:
        engine = self.server.engine
        try:
            if engine is None:
                raise EngineError("protocol: send init before query")
            prompt = frame.get("prompt")
            if not isinstance(prompt, str | list):
                raise EngineError("protocol: query needs a 'prompt' (string or content blocks)")

            async def emit(data: dict[str, Any]) -> None:
                await self.send(p.make(p.MESSAGE, id=fid, data=data))

            async def check_limits() -> list[dict[str, Any]]:
                return await self._check_limits(fid)

            live_config = frame.get("config")
            if isinstance(live_config, dict):  # the session's config changed (PATCH .../config)
                engine.reconfigure(live_config)
            self._undo = (fid, engine.checkpoint()) if isinstance(engine, Engine) else None
            await engine.query(
                prompt,
                emit=emit,
                model=frame.get("model") or None,
                include_partial=bool(frame.get("includePartialMessages")),
                check_limits=check_limits if self.protocol >= 2 else None,
                options=QueryOptions.from_frame(frame),
            )
        except asyncio.CancelledError:
            if self.sock.fileno() < 0:
                raise
            reason = self.interrupt_reasons.pop(fid, None)
            if fid in self._withdrawn:
                reason = "withdrawn"
            await self.send_quiet(p.make(p.ERROR, id=fid, error=f"interrupted: {reason}" if reason else "interrupted"))
        except EngineError as exc:
            await self.send_quiet(p.make(p.ERROR, id=fid, error=str(exc)))
        except OSError:
            return  # the connection is gone; nobody to tell
        except Exception as exc:
            log.exception("query failed")
            await self.send_quiet(p.make(p.ERROR, id=fid, error=f"bridge failure: {type(exc).__name__}: {exc}"))
        finally:
            self.queries.pop(fid, None)
            if fid in self._withdrawn:
                self._withdrawn.discard(fid)
                if self._undo is not None and self._undo[0] == fid:
                    self._undo[1]()
                    self._undo = None
        await self.send_quiet(p.make(p.DONE, id=fid))

    async def _check_limits(self, query_id: str) -> list[dict[str, Any]]:
        """Ask the server which sandbox limits were hit (it reads the kernel's counters; the bridge
        cannot see them). Returns its notices `{limit, message}`; none if it does not answer."""
        self._check_seq += 1
        check_id = f"c-{self._check_seq}"
        waiter: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._checks[check_id] = waiter
        try:
            await self.send(p.make(p.LIMITS_CHECK, id=query_id, checkId=check_id))
            return await asyncio.wait_for(waiter, LIMITS_CHECK_TIMEOUT)
        except (TimeoutError, OSError):
            log.warning("the server did not answer a limits check")
            return []
        finally:
            self._checks.pop(check_id, None)

    async def _exec(self, fid: str | None, frame: p.Frame) -> None:
        engine = self.server.engine
        env = engine.config.tool_env() if engine is not None else dict(os.environ)
        result = await run_exec(frame.get("argv"), frame.get("timeout"), self.server.workspace, env)
        await self.send_quiet(p.make(p.EXEC_RESULT, id=fid, **result))
