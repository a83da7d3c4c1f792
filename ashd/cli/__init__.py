"""The `ashd` command: `serve` and `config` for the operator, `keys` on the data directory, and
remote commands (`agents`, `sessions`, `chat`, `status`) that talk HTTP to a server."""

from __future__ import annotations

import sys

import click

from ashd import __version__
from ashd.cli._agents import agents
from ashd.cli._chat import chat
from ashd.cli._keys import keys
from ashd.cli._queue import queue
from ashd.cli._serve import runner, serve
from ashd.cli._sessions import sessions
from ashd.cli._status import status
from ashd.config import options_markdown
from ashd.errors import ConfigError, ServiceError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ashd", message="%(prog)s %(version)s")
def cli() -> None:
    """ashd: hosted agent orchestration service."""


@cli.command("config")
def config() -> None:
    """Print the configuration table (markdown)."""
    click.echo(options_markdown())


for command in (serve, runner, keys, agents, sessions, chat, status, queue):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    # click turns a closed pipe (`ashd config | head`) into a quiet exit 1, without BrokenPipeError.
    try:
        cli.main(args=argv, prog_name="ashd", standalone_mode=False)
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except ConfigError as exc:
        print(f"ashd: configuration error: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:
        print(f"ashd: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
