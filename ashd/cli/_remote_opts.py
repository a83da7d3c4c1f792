"""--url/ASHD_URL and --key/ASHD_KEY, shared by every command that talks to a server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ashd.cli._http import DEFAULT_URL, Remote

F = TypeVar("F", bound=Callable[..., Any])


def remote_options(func: F) -> F:
    func = click.option("--key", envvar="ASHD_KEY", default=None, show_envvar=True,
                        help="API key (Bearer)")(func)
    return click.option("--url", envvar="ASHD_URL", default=DEFAULT_URL, show_default=True, show_envvar=True,
                        help="the ashd server")(func)


def remote(url: str, key: str | None) -> Remote:
    return Remote(url, key)
