"""Command line: `ashd serve`, `ashd keys create`, `ashd config`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ashd import __version__
from ashd.config import load_settings, options_markdown
from ashd.errors import ConfigError
from ashd.logs import setup_logging


def _serve() -> int:
    from ashd.app import run

    settings = load_settings()
    setup_logging(settings.log_level)
    asyncio.run(run(settings))
    return 0


def _keys_create(tenant: str, label: str | None) -> int:
    from ashd.storage import ApiKeys, Database

    settings = load_settings()

    async def mint() -> str:
        settings.data_path.mkdir(parents=True, exist_ok=True)
        db = await Database.open(settings.effective_database_url)
        try:
            keys = await ApiKeys.open(db)
            _, key = await keys.mint(tenant, label, source="operator")
            return key
        finally:
            await db.close()

    # The key is printed once, to stdout, for the operator; it is never logged.
    print(asyncio.run(mint()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ashd", description="ashd: hosted agent orchestration service")
    parser.add_argument("--version", action="version", version=f"ashd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the service (configuration from SERVICE_* variables)")
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="mint an API key for a tenant and print it")
    create.add_argument("--tenant", default="default")
    create.add_argument("--label", default=None)
    sub.add_parser("config", help="print the configuration table (markdown)")
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve()
        if args.command == "keys":
            return _keys_create(args.tenant, args.label)
        if args.command == "config":
            print(options_markdown())
            return 0
    except ConfigError as exc:
        print(f"ashd: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
