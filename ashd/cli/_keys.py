"""`ashd keys create|list|revoke`: API keys, straight in the server's database (operator's tool)."""

from __future__ import annotations

from typing import Any

import click

from ashd.cli._local import local_settings, with_database
from ashd.cli._output import print_json, table
from ashd.storage import DEFAULT_TENANT, ApiKeys, Database

DATA_DIR_HELP = "the server's data directory (default: SERVICE_DATA_DIR or ./data)"


@click.group("keys")
def keys() -> None:
    """Manage API keys (works on the data directory; no server needed)."""


@keys.command("create")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True)
@click.option("--label", default=None, help="a name to tell the key apart in `ashd keys list`")
@click.option("--data-dir", default=None, help=DATA_DIR_HELP)
def create(tenant: str, label: str | None, data_dir: str | None) -> None:
    """Mint an API key for a tenant and print it (shown this once, never logged)."""

    async def mint(db: Database) -> str:
        _, key = await (await ApiKeys.open(db)).mint(tenant, label, source="operator")
        return key

    click.echo(with_database(local_settings(data_dir), mint))


@keys.command("list")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True)
@click.option("--data-dir", default=None, help=DATA_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_keys(tenant: str, data_dir: str | None, as_json: bool) -> None:
    """List a tenant's keys (their first characters only)."""

    async def listed(db: Database) -> list[dict[str, Any]]:
        return list(await (await ApiKeys.open(db)).list(tenant))

    rows = with_database(local_settings(data_dir), listed)
    if as_json:
        print_json(rows)
        return
    table(rows, [("id", "ID"), ("keyPrefix", "KEY"), ("label", "LABEL"), ("createdAt", "CREATED"),
                 ("lastUsedAt", "LAST USED")], f"tenant {tenant} has no API keys")


@keys.command("revoke")
@click.argument("key_id")
@click.option("--tenant", default=DEFAULT_TENANT, show_default=True)
@click.option("--data-dir", default=None, help=DATA_DIR_HELP)
def revoke(key_id: str, tenant: str, data_dir: str | None) -> None:
    """Revoke a key by its ID (a running server stops accepting it within seconds)."""

    async def delete(db: Database) -> None:
        await (await ApiKeys.open(db)).delete(tenant, key_id)

    with_database(local_settings(data_dir), delete)
    click.echo(f"revoked {key_id}")
