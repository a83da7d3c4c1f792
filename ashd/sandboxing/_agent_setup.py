"""Host-side preparation of a workspace for a session: the agent folder copied in, the session's
system prompt and MCP servers applied to the copy only. Runs in actor/worker threads (blocking IO).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ashd.errors import SandboxError

_SKIP = shutil.ignore_patterns("node_modules", ".git", "__pycache__", "*.sock", "*.pid")


def copy_agent(agent_dir: Path, workspace: Path) -> None:
    if not (agent_dir / "AGENT.md").is_file():
        raise SandboxError(f"Agent folder {agent_dir} has no AGENT.md; redeploy the agent")
    # symlinks=True copies links as links: a link pointing outside the agent folder is not followed.
    shutil.copytree(agent_dir, workspace, symlinks=True, ignore=_SKIP, dirs_exist_ok=True)


def apply_session_config(workspace: Path, system_prompt: str | None, mcp_servers: dict[str, Any] | None) -> None:
    if system_prompt is not None:
        target = workspace / "AGENT.md"
        if target.is_symlink():
            target.unlink()
        target.write_text(system_prompt, encoding="utf-8")
    if mcp_servers:
        path = workspace / ".mcp.json"
        merged: dict[str, Any] = {}
        if path.is_file() and not path.is_symlink():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(loaded, dict):
                    merged = loaded
            except (OSError, ValueError):
                merged = {}
        existing = merged.get("mcpServers")
        servers: dict[str, Any] = existing if isinstance(existing, dict) else {}
        merged["mcpServers"] = {**servers, **mcp_servers}  # the session wins on an equal key
        if path.is_symlink():
            path.unlink()
        path.write_text(json.dumps(merged, indent=2), encoding="utf-8")


def chown_tree(root: Path, uid: int | None, gid: int | None) -> None:
    if uid is None or os.geteuid() != 0:
        return
    g = gid if gid is not None else uid
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, g, follow_symlinks=False)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, g, follow_symlinks=False)


def prepare_workspace(agent_dir: Path | None, workspace: Path, system_prompt: str | None,
                      mcp_servers: dict[str, Any] | None, owner: tuple[int, int] | None) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    if agent_dir is not None:
        copy_agent(agent_dir, workspace)
    apply_session_config(workspace, system_prompt, mcp_servers)
    if owner is not None:
        chown_tree(workspace, owner[0], owner[1])
