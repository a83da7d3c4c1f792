"""How the CLI prints: tables for people, `--json` for scripts, spinners on anything that waits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)
if not console.is_terminal:
    console.width = 1000  # piped into grep or a file: one line per row, never folded at 80 columns


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], empty: str) -> None:
    """`columns` are (field, heading) pairs; a missing field shows as an empty cell."""
    if not rows:
        errors.print(f"[dim]{empty}[/dim]")
        return
    out = Table(box=None, header_style="bold", pad_edge=False)
    for _, heading in columns:
        out.add_column(heading, overflow="fold")
    for row in rows:
        out.add_row(*(_cell(row.get(field)) for field, _ in columns))
    console.print(out)


def fields(record: dict[str, Any]) -> None:
    """One record as `name: value` lines; nested values as compact JSON."""
    width = max((len(k) for k in record), default=0)
    for key, value in record.items():
        console.print(f"[bold]{key.ljust(width)}[/bold]  {_cell(value)}", soft_wrap=True)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@contextmanager
def waiting(what: str) -> Iterator[None]:
    """A spinner on stderr while the block runs (nothing when stderr is not a terminal)."""
    if not errors.is_terminal:
        yield
        return
    with errors.status(what, spinner="dots"):
        yield
