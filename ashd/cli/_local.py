"""Commands that work on the data directory itself (no server needed), and the guard that keeps
them from creating a database that no server uses: an operator who runs `ashd keys create` from
another directory gets told where to look, not a key for an empty new database."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import create_async_engine

from ashd.config import Settings, load_settings
from ashd.storage import Database

T = TypeVar("T")


def local_settings(data_dir: str | None) -> Settings:
    environ = dict(os.environ)
    if data_dir is not None:
        environ["SERVICE_DATA_DIR"] = data_dir
    return load_settings(environ)


async def _has_schema(url: str) -> bool:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return bool(await conn.run_sync(lambda sync: inspect(sync).has_table("api_keys")))
    finally:
        await engine.dispose()


def _where(settings: Settings) -> str:
    if settings.database_url:
        return "the database of SERVICE_DATABASE_URL"
    return f"{settings.data_path / 'ashd.db'}"


def with_database(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> T:
    """Run `work` on the existing ashd database of `settings`; refuse when there is none."""

    async def run() -> T:
        missing = not settings.database_url and not Path(settings.data_path / "ashd.db").is_file()
        if missing or not await _has_schema(settings.effective_database_url):
            raise click.ClickException(
                f"no ashd database at {_where(settings)}: run this where the server runs, or name its "
                "data directory with --data-dir (or SERVICE_DATA_DIR; SERVICE_DATABASE_URL for PostgreSQL). "
                "`ashd serve` creates the database on its first start.")
        db = await Database.open(settings.effective_database_url)
        try:
            return await work(db)
        finally:
            await db.close()

    return asyncio.run(run())
