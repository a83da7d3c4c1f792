"""The Database handle: engine, session factory and server-wide meta values."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import AsyncSession as OrmSession

from ashd.storage._engine import create_engine, normalise_url, sessionmaker
from ashd.storage._migrate import migrate
from ashd.storage._models import Meta


class Database:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine)

    @classmethod
    async def open(cls, url: str) -> Database:
        db = cls(create_engine(url))
        await migrate(db.engine)
        return db

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @staticmethod
    def describe(url: str) -> str:
        """The URL without its password, for logs and /health."""
        from sqlalchemy.engine import make_url

        return make_url(normalise_url(url)).render_as_string(hide_password=True)

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[OrmSession]:
        """One transaction: committed on success, rolled back on any error."""
        async with self._sessions() as s, s.begin():
            yield s

    @asynccontextmanager
    async def read(self) -> AsyncIterator[OrmSession]:
        async with self._sessions() as s:
            yield s

    async def meta(self, name: str) -> str | None:
        async with self.read() as s:
            return (await s.execute(select(Meta.value).where(Meta.name == name))).scalar_one_or_none()

    async def close(self) -> None:
        await self.engine.dispose()
