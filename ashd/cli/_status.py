"""`ashd status`: health, sandbox pool and runners of a server."""

from __future__ import annotations

from typing import Any

import click

from ashd.cli._output import console, print_json
from ashd.cli._remote_opts import remote, remote_options


@click.command("status")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print /health as JSON")
def status(url: str, key: str | None, as_json: bool) -> None:
    """Is the server up: version, uptime, sessions, sandbox pool, runners, warnings."""
    health: dict[str, Any] = remote(url, key).call("GET", "/health")
    if as_json:
        print_json(health)
        return
    console.print(f"[bold green]{health.get('status')}[/]  ashd {health.get('version')} at {url}, "
                  f"mode {health.get('mode')}, up {int(health.get('uptime', 0))} s")
    console.print(f"sessions  {health.get('activeSessions')} active, "
                  f"{health.get('activeSandboxes')} sandboxes")
    pool = health.get("pool") or {}
    console.print("pool      " + (", ".join(f"{k} {v}" for k, v in pool.items()) or "empty"))
    if "remoteRunners" in health:
        console.print(f"runners   {health['remoteRunners']} remote")
    iso = health.get("isolation")
    if isinstance(iso, dict):
        console.print(f"isolation {iso.get('detail')}" + (" [bold red](weak)[/]" if iso.get("weak") else ""))
    for warning in health.get("warnings") or []:
        console.print(f"[yellow]warning[/]   {warning}")
