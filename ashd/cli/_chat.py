"""`ashd chat AGENT`: a conversation in the terminal. The reply streams as it is written; tool calls
and their results show as they happen; Ctrl-C interrupts the turn, Ctrl-D or /exit leaves."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import click

from ashd.cli._http import Remote
from ashd.cli._output import console, errors
from ashd.cli._progress import setup_progress
from ashd.cli._remote_opts import remote, remote_options

_EXIT = frozenset({"/exit", "/quit"})
_SHOWN = 300  # characters of a tool's input or result shown inline


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return "" if content is None else str(content)


class TurnPrinter:
    """Turns the SSE frames of one turn into terminal output."""

    def __init__(self) -> None:
        self.streamed = False  # text deltas were printed for the current assistant message
        self.at_line_start = True

    def _line(self, text: str, style: str) -> None:
        if not self.at_line_start:
            sys.stdout.write("\n")
        console.print(text, style=style, markup=False, soft_wrap=True)
        self.at_line_start = True

    def _text(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith("\n")

    def frame(self, event: str, data: Any) -> bool:
        """Print one frame; True when the turn is over."""
        if event == "done":
            if not self.at_line_start:
                self._text("\n")
            return True
        if event == "error":
            self._line(f"error: {data.get('error') if isinstance(data, dict) else data}", "bold red")
            return False
        if event == "message" and isinstance(data, dict):
            self._message(data)
        return False

    def _message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "stream_event":
            inner = msg.get("event") or {}
            delta = inner.get("delta") or {}
            if inner.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                self._text(str(delta.get("text", "")))
                self.streamed = True
        elif kind == "assistant":
            for block in (msg.get("message") or {}).get("content") or []:
                if block.get("type") == "text" and not self.streamed:
                    self._text(str(block.get("text", "")))
                elif block.get("type") == "tool_use":
                    self._line(f"→ {block.get('name')} {_short(block.get('input', {}))}", "cyan")
            self.streamed = False
        elif kind == "user":
            content = (msg.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    failed = bool(block.get("is_error"))
                    self._line(f"← {'failed: ' if failed else ''}{_short(_result_text(block))}",
                               "red" if failed else "green")
        elif kind == "result":
            cost = msg.get("total_cost_usd")
            usage = msg.get("usage") or {}
            tokens = int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
            cost_text = f", ${cost:.4f}" if isinstance(cost, int | float) else ""
            self._line(f"({tokens} tokens{cost_text})", "dim")


def run_turn(client: Remote, session_id: str, text: str) -> None:
    printer = TurnPrinter()
    frames = client.stream(f"/api/sessions/{session_id}/messages",
                           {"content": text, "includePartialMessages": True})
    try:
        for event, data in frames:
            if printer.frame(event, data):
                return
    except KeyboardInterrupt:
        client.call("POST", f"/api/sessions/{session_id}/interrupt")
        printer._line("(interrupted)", "yellow")


def _prompts(messages: tuple[str, ...]) -> Iterable[str]:
    if messages:
        yield from messages
        return
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = console.input("[bold]you> [/bold]") if interactive else input()
        except EOFError:
            if interactive:
                sys.stdout.write("\n")
            return
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            return
        if line.strip() in _EXIT:
            return
        if line.strip():
            yield line


@click.command("chat")
@click.argument("agent")
@click.option("--session", "session_id", default=None, help="continue this session instead of starting one")
@click.option("-m", "--message", "messages", multiple=True,
              help="send this message and exit (repeatable); without it, chat interactively")
@remote_options
def chat(agent: str, session_id: str | None, messages: tuple[str, ...], url: str, key: str | None) -> None:
    """Talk to AGENT in the terminal: starts a session (or continues --session) and streams the replies."""
    client = remote(url, key)
    if session_id is None:
        with setup_progress(client, agent, f"starting a session of {agent} (its sandbox and setup come first)"):
            session = client.call("POST", "/api/sessions", {"agent": agent})["session"]
        session_id = str(session["id"])
    else:
        session = client.call("GET", f"/api/sessions/{session_id}")["session"]
        if session["status"] != "active":
            with setup_progress(client, agent, f"resuming session {session_id} ({session['status']})", session_id):
                client.call("POST", f"/api/sessions/{session_id}/resume")
    errors.print(f"[dim]session {session_id} · agent {agent} · Ctrl-C interrupts a turn, "
                 "Ctrl-D or /exit leaves[/dim]", soft_wrap=True)
    for text in _prompts(messages):
        run_turn(client, session_id, text)
    errors.print(f"[dim]session {session_id} stays; continue with `ashd chat {agent} --session {session_id}`, "
                 f"end it with `ashd sessions rm {session_id}`[/dim]", soft_wrap=True)
