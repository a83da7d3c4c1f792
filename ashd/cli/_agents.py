"""`ashd agents deploy|list|show|rm`."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import click

from ashd.cli._output import fields, print_json, table, waiting
from ashd.cli._remote_opts import remote, remote_options

# What a deploy leaves out of an agent folder: version control and dependency trees the agent's
# own setup recreates (they are large and machine-specific).
_SKIPPED_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv"})


@click.group("agents")
def agents() -> None:
    """Deploy and inspect agents."""


def folder_files(folder: Path) -> list[dict[str, str]]:
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not _SKIPPED_DIRS.intersection(rel.parts[:-1]):
            data = path.read_bytes()
            files.append({"path": rel.as_posix(), "content": base64.b64encode(data).decode(), "encoding": "base64"})
    return files


@agents.command("deploy")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", default=None, help="agent name (default: the folder's name)")
@remote_options
def deploy(folder: Path, name: str | None, url: str, key: str | None) -> None:
    """Upload an agent FOLDER (with AGENT.md) and deploy it; deploying a name again makes a new version."""
    if not (folder / "AGENT.md").is_file():
        raise click.ClickException(f"{folder} has no AGENT.md: an agent folder needs one (its system prompt)")
    name = name or folder.resolve().name
    files = folder_files(folder)
    size = sum(len(f["content"]) * 3 // 4 for f in files)
    with waiting(f"uploading {len(files)} files ({size // 1024} KiB) as agent {name}"):
        body = remote(url, key).call("POST", "/api/agents", {"name": name, "files": files})
    agent = body["agent"]
    click.echo(f"deployed {agent['name']} version {agent['version']}")


@agents.command("list")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_agents(url: str, key: str | None, as_json: bool) -> None:
    """List the tenant's agents."""
    rows: list[dict[str, Any]] = remote(url, key).call("GET", "/api/agents")["agents"]
    if as_json:
        print_json(rows)
        return
    table(rows, [("name", "NAME"), ("version", "VERSION"), ("updatedAt", "UPDATED")],
          "no agents yet: `ashd agents deploy FOLDER`")


@agents.command("show")
@click.argument("name")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def show(name: str, url: str, key: str | None, as_json: bool) -> None:
    """Show one agent."""
    agent = remote(url, key).call("GET", f"/api/agents/{name}")["agent"]
    print_json(agent) if as_json else fields(agent)


@agents.command("rm")
@click.argument("name")
@remote_options
def rm(name: str, url: str, key: str | None) -> None:
    """Remove an agent's registration (its sessions stay)."""
    remote(url, key).call("DELETE", f"/api/agents/{name}")
    click.echo(f"removed {name}")
