"""MCP servers from /workspace/.mcp.json, reached with the mcp 2.x client.

Each server lives in its own task: the mcp transports are anyio context managers that must be
entered and left in the same task, while tool calls come from the query tasks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ashd.bridge.engine._background import retrieve, wait_started
from ashd.bridge.engine.tools._base import ToolContext, ToolResult, cap

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 300.0

LogFn = Callable[[str, str], Awaitable[None]]


@dataclass
class McpServerState:
    name: str
    status: str = "pending"  # (starting) | connected | failed | stopped
    error: str | None = None
    tools: list[Any] = field(default_factory=list)
    session: Any = None
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    server: McpServerState
    remote_name: str

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if self.server.session is None or self.server.status != "connected":
            return ToolResult(f"MCP server {self.server.name} is not connected", is_error=True)
        result = await self.server.session.call_tool(self.remote_name, args, read_timeout_seconds=CALL_TIMEOUT_S)
        return ToolResult(_convert_content(result.content), is_error=bool(result.is_error))


def _convert_content(items: list[Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in items:
        kind = getattr(item, "type", None)
        if kind == "text":
            blocks.append({"type": "text", "text": cap(item.text)})
        elif kind == "image":
            data = item.data if isinstance(item.data, str) else base64.b64encode(item.data).decode()
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": item.mime_type, "data": data}})
        else:
            dump = item.model_dump(mode="json") if hasattr(item, "model_dump") else str(item)
            blocks.append({"type": "text", "text": cap(json.dumps(dump))})
    return blocks or [{"type": "text", "text": "(no content)"}]


def read_mcp_config(workspace: Path) -> dict[str, dict[str, Any]]:
    path = workspace / ".mcp.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    return {str(k): v for k, v in (servers or {}).items() if isinstance(v, dict)}


class McpManager:
    def __init__(self, workspace: Path, env: dict[str, str], log_fn: LogFn) -> None:
        self._workspace = workspace
        self._env = env
        self._log = log_fn
        self.servers: dict[str, McpServerState] = {}
        self._starting: asyncio.Future[Any] | None = None  # `begin`'s servers, until each is up or failed

    def begin(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start every configured server in parallel, in the background: a stdio server is a process
        and its handshake, a second or more (a Python one here: 0.9 s), which a session's create
        need not wait for. `ready` waits for them; failures are logged, never dropped."""
        try:
            config = read_mcp_config(self._workspace)
        except (OSError, ValueError) as exc:
            self._starting = asyncio.ensure_future(self._log("error", f"MCP: cannot read .mcp.json: {exc}"))
            self._starting.add_done_callback(retrieve)
            return
        waits = []
        for name, spec in config.items():
            state = McpServerState(name)
            self.servers[name] = state
            ready = asyncio.Event()
            state.task = asyncio.create_task(self._run(state, spec, ready), name=f"mcp-{name}")
            waits.append(self._await_ready(state, ready, timeout))
        if waits:
            self._starting = asyncio.gather(*waits)
            self._starting.add_done_callback(retrieve)

    async def ready(self) -> None:
        """Wait until every server `begin` started has connected or failed (each within its
        timeout). Cancelling the wait leaves the servers starting."""
        await wait_started(self._starting, "the MCP servers' start ended with an error")

    async def _await_ready(self, state: McpServerState, ready: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(ready.wait(), timeout)
        except TimeoutError:
            state.status, state.error = "failed", f"did not start within {timeout:.0f}s"
            if state.task:
                state.task.cancel()
        if state.status == "connected":
            await self._log("info", f"MCP server {state.name}: connected, {len(state.tools)} tools")
        else:
            await self._log("error", f"MCP server {state.name} failed to start: {state.error}")

    async def _run(self, state: McpServerState, spec: dict[str, Any], ready: asyncio.Event) -> None:
        from mcp import ClientSession  # imported lazily: ~0.3 s, only when servers are configured

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._enter_transport(stack, spec)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await session.list_tools()
                state.tools, state.session, state.status = list(listed.tools), session, "connected"
                ready.set()
                await state.stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            state.status, state.error = "failed", _explain(exc)
            log.debug("MCP server %s failed", state.name, exc_info=True)
        finally:
            state.session = None
            if state.status == "connected":
                state.status = "stopped"
            ready.set()

    async def _enter_transport(self, stack: contextlib.AsyncExitStack, spec: dict[str, Any]) -> tuple[Any, Any]:
        if spec.get("command"):
            from mcp.client.stdio import StdioServerParameters, stdio_client

            env = dict(self._env)
            env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
            params = StdioServerParameters(
                command=str(spec["command"]),
                args=[str(a) for a in spec.get("args") or []],
                env=env,
                cwd=str(self._workspace),
            )
            streams = await stack.enter_async_context(stdio_client(params))
            return streams[0], streams[1]
        url = spec.get("url")
        if not isinstance(url, str):
            raise ValueError("server needs either 'command' (stdio) or 'url' (remote)")
        headers = {str(k): str(v) for k, v in (spec.get("headers") or {}).items()}
        if spec.get("type") == "sse":
            from mcp.client.sse import sse_client

            streams = await stack.enter_async_context(sse_client(url, headers=headers))
            return streams[0], streams[1]
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=30.0))
        streams = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        return streams[0], streams[1]

    def tools(self) -> list[McpTool]:
        out: list[McpTool] = []
        for state in self.servers.values():
            if state.status != "connected":
                continue
            for tool in state.tools:
                out.append(
                    McpTool(
                        name=f"mcp__{state.name}__{tool.name}",
                        description=tool.description or f"{tool.name} (MCP server {state.name})",
                        input_schema=dict(tool.input_schema or {"type": "object"}),
                        server=state,
                        remote_name=tool.name,
                    )
                )
        return out

    def status(self) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "status": s.status, **({"error": s.error} if s.error else {})}
            for s in self.servers.values()
        ]

    async def stop(self, timeout: float = 5.0) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()  # no report of servers that were still starting: they are stopped
        tasks = [s.task for s in self.servers.values() if s.task is not None]
        for state in self.servers.values():
            state.stop.set()
            if state.status == "pending" and state.task is not None:
                state.task.cancel()  # still connecting: nothing to close cleanly yet
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)


def _explain(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
