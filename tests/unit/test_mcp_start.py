"""The engine's MCP servers start in the background (`McpManager.begin`); `ready` waits for them:
an interrupted wait leaves them starting, a stop while they start ends every wait at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ashd.bridge.engine._mcp import McpManager


def _manager(tmp_path: Path, servers: dict[str, dict[str, object]], logs: list[str]) -> McpManager:
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": servers}))

    async def log(level: str, message: str) -> None:
        logs.append(f"{level}: {message}")

    return McpManager(tmp_path, {"PATH": "/usr/bin:/bin"}, log)


async def test_a_cancelled_wait_leaves_the_servers_starting_and_a_stop_ends_every_wait(tmp_path: Path) -> None:
    logs: list[str] = []
    mcp = _manager(tmp_path, {"mute": {"command": "sleep", "args": ["600"]}}, logs)  # never answers
    mcp.begin()
    assert [s["status"] for s in mcp.status()] == ["pending"]
    first = asyncio.create_task(mcp.ready())
    await asyncio.sleep(0.2)
    first.cancel()  # an interrupted query
    with pytest.raises(asyncio.CancelledError):
        await first
    assert [s["status"] for s in mcp.status()] == ["pending"]  # still starting
    second = asyncio.create_task(mcp.ready())
    await asyncio.sleep(0.2)
    assert not second.done()
    await asyncio.wait_for(mcp.stop(), 10)  # the engine closes: the waiting query is not interrupted
    await asyncio.wait_for(second, 5)
    assert not second.cancelled()
    assert logs == []  # a server stopped while it started is not reported as failed


async def test_a_failed_server_is_reported_before_the_wait_ends(tmp_path: Path) -> None:
    logs: list[str] = []
    mcp = _manager(tmp_path, {"broken": {"command": "/no/such/mcp-server"}}, logs)
    mcp.begin()
    await asyncio.wait_for(mcp.ready(), 30)
    assert [s["status"] for s in mcp.status()] == ["failed"]
    assert len(logs) == 1 and logs[0].startswith("error: MCP server broken failed to start")
    await mcp.stop()


async def test_no_servers_no_wait(tmp_path: Path) -> None:
    mcp = McpManager(tmp_path, {}, lambda level, message: asyncio.sleep(0))
    mcp.begin()
    await asyncio.wait_for(mcp.ready(), 1)
    assert mcp.status() == []
