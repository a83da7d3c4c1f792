"""Migration 14: an attachments table made before it (no `content` column, no session index) gets
both, and attachments are then stored and read back with their bytes, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import column, delete, inspect, table, text

from ashd.storage import Attachments, Database, Session
from ashd.storage._migrate import migrate


async def test_attachments_table_made_before_migration_14_gets_its_content_column(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        async with db.engine.begin() as conn:  # the table as migration 1 made it, before 14
            await conn.execute(text("DROP TABLE attachments"))
            await conn.execute(text(
                "CREATE TABLE attachments (id VARCHAR(36) PRIMARY KEY, tenant_id VARCHAR(255) NOT NULL, "
                "message_id VARCHAR(36), session_id VARCHAR(36) NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, "
                "filename VARCHAR(1024) NOT NULL, mime_type VARCHAR(255) NOT NULL, size BIGINT NOT NULL, "
                "storage_path TEXT NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL)"))
            migrations = table("schema_migrations", column("version"))
            await conn.execute(delete(migrations).where(migrations.c.version == 14))
        assert await migrate(db.engine) == [14]
        async with db.engine.connect() as conn:
            columns, indexes = await conn.run_sync(lambda c: (
                {col["name"] for col in inspect(c).get_columns("attachments")},
                {ix["name"] for ix in inspect(c).get_indexes("attachments")}))
        assert "content" in columns and "ix_attachments_session" in indexes
        async with db.tx() as s:
            s.add(Session(id="5e0b0c1e-0000-4000-8000-000000000001", tenant_id="t", agent_name="a"))
        store = Attachments(db)
        data = bytes(range(256)) * 4
        made = await store.create("t", "5e0b0c1e-0000-4000-8000-000000000001", "b.bin", "application/octet-stream",
                                  data)
        assert (await store.read("t", made.id)).data == data
        assert [r.id for r in await store.list("t", "5e0b0c1e-0000-4000-8000-000000000001")] == [made.id]
    finally:
        await db.close()
