"""`ashd sessions list|show|pause|resume|stop|rm|files|events|logs`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from ashd.cli._output import console, fields, print_json, table, waiting
from ashd.cli._remote_opts import remote, remote_options

_COLUMNS = [("id", "ID"), ("agentName", "AGENT"), ("status", "STATUS"), ("createdAt", "CREATED"),
            ("lastActiveAt", "LAST ACTIVE")]


@click.group("sessions")
def sessions() -> None:
    """Inspect and control sessions."""


@sessions.command("list")
@click.option("--agent", default=None, help="only this agent's sessions")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_sessions(agent: str | None, url: str, key: str | None, as_json: bool) -> None:
    """List the tenant's sessions."""
    params = {"agent": agent} if agent else None
    rows: list[dict[str, Any]] = remote(url, key).call("GET", "/api/sessions", params=params)["sessions"]
    if as_json:
        print_json(rows)
        return
    table(rows, _COLUMNS, "no sessions: `ashd chat AGENT` starts one")


@sessions.command("show")
@click.argument("session_id")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def show(session_id: str, url: str, key: str | None, as_json: bool) -> None:
    """Show one session."""
    session = remote(url, key).call("GET", f"/api/sessions/{session_id}")["session"]
    print_json(session) if as_json else fields(session)


def _transition(verb: str, method: str, path: str, doing: str) -> click.Command:
    @remote_options
    def command(session_id: str, url: str, key: str | None) -> None:
        with waiting(f"{doing} session {session_id}"):
            session = remote(url, key).call(method, path.format(id=session_id))["session"]
        click.echo(f"{session['id']} {session['status']}")

    command.__doc__ = {
        "pause": "Pause an active session.",
        "resume": "Resume a paused, stopped or failed session.",
        "stop": "Stop a session: keep its workspace, free its sandbox.",
        "rm": "End a session for good (sandbox destroyed; messages and events stay).",
    }[verb]
    return click.argument("session_id")(click.command(verb)(command))


sessions.add_command(_transition("pause", "POST", "/api/sessions/{id}/pause", "pausing"))
sessions.add_command(_transition("resume", "POST", "/api/sessions/{id}/resume", "resuming"))
sessions.add_command(_transition("stop", "POST", "/api/sessions/{id}/stop", "stopping"))
sessions.add_command(_transition("rm", "DELETE", "/api/sessions/{id}", "ending"))


@sessions.command("files")
@click.argument("session_id")
@click.argument("path", required=False)
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print JSON (the listing)")
def files(session_id: str, path: str | None, url: str, key: str | None, as_json: bool) -> None:
    """List the session's workspace files, or print one file (PATH) to stdout."""
    client = remote(url, key)
    if path:
        data = client.call("GET", f"/api/sessions/{session_id}/files/{path}", params={"format": "raw"})
        sys.stdout.buffer.write(data if isinstance(data, bytes) else str(data).encode())
        return
    rows: list[dict[str, Any]] = client.call("GET", f"/api/sessions/{session_id}/files")["files"]
    if as_json:
        print_json(rows)
        return
    table(rows, [("path", "PATH"), ("size", "SIZE"), ("modifiedAt", "MODIFIED")], "the workspace is empty")


@sessions.command("events")
@click.argument("session_id")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print the stored events as JSON")
def events(session_id: str, url: str, key: str | None, as_json: bool) -> None:
    """Print the session's stored events (what happened, in order)."""
    client, found, after = remote(url, key), [], 0
    while True:  # the server pages events; a long session has more than one page
        page: list[dict[str, Any]] = client.call(
            "GET", f"/api/sessions/{session_id}/events", params={"after": after, "limit": 1000})["events"]
        found.extend(page)
        if len(page) < 1000:
            break
        after = int(page[-1]["sequence"])
    if as_json:
        print_json(found)
        return
    for event in found:
        click.echo(f"{event.get('createdAt', '')}  {event.get('type', '?'):<14} {_summary(event.get('data'))}")


@sessions.command("logs")
@click.argument("session_id")
@click.option("-f", "--follow", is_flag=True, help="keep printing new lines while the session has a sandbox")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object per line")
def logs(session_id: str, follow: bool, url: str, key: str | None, as_json: bool) -> None:
    """Print the session's logs: its agent's setup output and its sandbox's stderr."""
    client, after = remote(url, key), -1
    while True:
        page = client.call("GET", f"/api/sessions/{session_id}/logs", params={"after": after, "limit": 1000})
        lines: list[dict[str, Any]] = page["logs"]
        for line in lines:
            print_log_line(line, as_json)
        if lines:
            after = int(lines[-1]["index"])
        if len(lines) == 1000:
            continue  # more pages now
        if not follow or page.get("source") != "live":
            return
        try:
            time.sleep(1.0)  # the server stores sandbox lines about once a second
        except KeyboardInterrupt:
            return


_LEVEL_STYLE = {"stdout": "", "stderr": "yellow", "system": "dim"}


def print_log_line(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    level = str(line.get("level", ""))
    text = f"{line.get('ts', '')}  {level:<6} {line.get('text', '')}"
    style = _LEVEL_STYLE.get(level, "")
    console.print(text, style=style or None, markup=False, highlight=False, soft_wrap=True)


def _summary(data: Any) -> str:
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return str(data)[:200]
    if isinstance(data, dict):
        return " ".join(f"{k}={v}" for k, v in data.items() if not isinstance(v, dict | list))[:200]
    return "" if data is None else str(data)[:200]
