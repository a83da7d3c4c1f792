"""`ashd queue add|list|show|cancel|stats`: prompts queued to run later as turns."""

from __future__ import annotations

from typing import Any

import click

from ashd.cli._output import fields, print_json, table
from ashd.cli._remote_opts import remote, remote_options

STATUSES = ("pending", "processing", "completed", "failed", "cancelled")
_COLUMNS = [("id", "ID"), ("agentName", "AGENT"), ("status", "STATUS"), ("priority", "PRIORITY"),
            ("retryCount", "RETRIES"), ("createdAt", "CREATED"), ("sessionId", "SESSION")]


@click.group("queue")
def queue() -> None:
    """Queue prompts to run later as turns, with retries (docs/queue.md)."""


@queue.command("add")
@click.argument("agent")
@click.argument("prompt")
@click.option("--session", "session_id", default=None, help="run in this session (default: a new one)")
@click.option("--priority", type=int, default=0, show_default=True, help="higher runs first")
@click.option("--max-retries", type=click.IntRange(0, 100), default=3, show_default=True,
              help="retries after a failed attempt (5 s, doubling up to 5 min)")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def add(agent: str, prompt: str, session_id: str | None, priority: int, max_retries: int, url: str,
        key: str | None, as_json: bool) -> None:
    """Queue PROMPT for AGENT; prints the item's id."""
    body: dict[str, Any] = {"agentName": agent, "prompt": prompt, "priority": priority, "maxRetries": max_retries}
    if session_id:
        body["sessionId"] = session_id
    item = remote(url, key).call("POST", "/api/queue", body)["item"]
    print_json(item) if as_json else click.echo(item["id"])


@queue.command("list")
@click.option("--status", type=click.Choice(STATUSES), default=None, help="only items in this status")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_items(status: str | None, limit: int, url: str, key: str | None, as_json: bool) -> None:
    """List the tenant's queue items, newest first."""
    params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
    rows: list[dict[str, Any]] = remote(url, key).call("GET", "/api/queue", params=params)["items"]
    if as_json:
        print_json(rows)
        return
    table(rows, _COLUMNS, "the queue is empty: `ashd queue add AGENT PROMPT` adds an item")


@queue.command("show")
@click.argument("item_id")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def show(item_id: str, url: str, key: str | None, as_json: bool) -> None:
    """Show one item: its status, session, result or error."""
    item = remote(url, key).call("GET", f"/api/queue/{item_id}")["item"]
    print_json(item) if as_json else fields(item)


@queue.command("cancel")
@click.argument("item_id")
@remote_options
def cancel(item_id: str, url: str, key: str | None) -> None:
    """Cancel a pending item (a running one finishes)."""
    item = remote(url, key).call("DELETE", f"/api/queue/{item_id}")["item"]
    click.echo(f"{item['id']} {item['status']}")


@queue.command("stats")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def stats(url: str, key: str | None, as_json: bool) -> None:
    """Count the tenant's items per status."""
    counts = remote(url, key).call("GET", "/api/queue/stats")["stats"]
    print_json(counts) if as_json else fields(counts)
