"""`ashd serve`, with the one start failure an operator meets most, a taken port, said in one line
before anything starts (instead of a traceback after the sandbox zygote is up)."""

from __future__ import annotations

import errno
import socket

import click

from ashd import event_loop
from ashd.config import Settings, load_settings
from ashd.logs import setup_logging


def _taken(settings: Settings, var: str = "SERVICE_PORT") -> click.ClickException:
    return click.ClickException(
        f"port {settings.port} on {settings.host} is already in use (another ashd? "
        f"`ss -ltnp 'sport = :{settings.port}'` shows which program); stop it or choose another port with "
        f"{var}")


def check_port(settings: Settings, var: str = "SERVICE_PORT") -> None:
    """Bind the address once, the way the server will (SO_REUSEADDR, as aiohttp does on Linux)."""
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise click.ClickException(f"SERVICE_HOST {settings.host!r} does not resolve: {exc.strerror}") from exc
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise _taken(settings, var) from exc
                raise click.ClickException(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from exc


@click.command("serve")
def serve() -> None:
    """Run the service (configuration from SERVICE_* variables; see `ashd config`)."""
    from ashd.app import run

    settings = load_settings()
    check_port(settings)
    setup_logging(settings.log_level)
    try:
        event_loop.run(run(settings), settings.event_loop)
    except event_loop.LoopUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # taken between the check and the start
            raise _taken(settings) from exc
        raise


@click.command("runner")
def runner() -> None:
    """Run a runner: a sandbox pool behind the runner API, registered with SERVICE_SERVER_URL."""
    from ashd.runner import run_runner

    settings = load_settings()
    check_port(settings.with_(port=settings.runner_port), "SERVICE_RUNNER_PORT")
    setup_logging(settings.log_level)
    try:
        event_loop.run(run_runner(settings), settings.event_loop)
    except event_loop.LoopUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
