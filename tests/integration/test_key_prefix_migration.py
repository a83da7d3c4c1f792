"""Migration 8: key prefixes stored before it (the first 12 characters of a key, a short key whole)
are cut to what the key list may show: 8 characters of a generated key, at most half of any other."""

from __future__ import annotations

from sqlalchemy import column, delete, select, table

from ashd.storage import Database
from ashd.storage._apikeys import ApiKeys, generate_key, shown_prefix
from ashd.storage._migrate import migrate
from ashd.storage._models import ApiKey


async def test_prefixes_stored_before_the_migration_are_shortened(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        generated = generate_key()
        old_rows = {  # what the code before migration 8 stored: key[:12]
            "generated": (generated, "generated"),
            "short-env": ("abcdefg", "env"),
            "long-env": ("correct-horse-battery-staple", "env"),
        }
        async with db.tx() as s:
            for label, (key, source) in old_rows.items():
                s.add(ApiKey(tenant_id="default", label=label, key_hash=label, key_prefix=key[:12], source=source))
        async with db.engine.begin() as conn:
            migrations = table("schema_migrations", column("version"))
            await conn.execute(delete(migrations).where(migrations.c.version == 8))
        assert await migrate(db.engine) == [8]
        async with db.read() as s:
            shown = dict((await s.execute(select(ApiKey.label, ApiKey.key_prefix))).all())
        assert shown == {"generated": generated[:8], "short-env": "abc", "long-env": "correc"}
        for label, (key, _) in old_rows.items():
            assert len(shown[label]) <= len(key) // 2 and len(shown[label]) <= 8
        # keys added after it store what the list may show
        keys = await ApiKeys.open(db)
        await keys.add("0123456789", "default", "new", "env")
        assert [k["keyPrefix"] for k in await keys.list("default") if k["label"] == "new"] == [shown_prefix("0123456789")] == ["01234"]
    finally:
        await db.close()
