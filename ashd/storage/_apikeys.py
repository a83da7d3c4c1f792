"""API keys: generated, hashed (HMAC-SHA256 with a server secret kept in `meta`), mapped to tenants."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, select, update

from ashd.errors import Conflict, NotFound
from ashd.storage._database import Database
from ashd.storage._models import ApiKey, iso, utcnow

KEY_PREFIX = "ashd_"
DEFAULT_TENANT = "default"
ENV_SOURCE = "env"  # the key of SERVICE_API_KEY: registered at every start, revoked by changing the setting
# A key list shows this many characters of a key at most ("ashd_" and 3 random ones for a generated
# key), and never more than half of a key, however short the key an operator chose.
SHOWN_PREFIX_CHARS = 8


def shown_prefix(key: str) -> str:
    return key[:min(SHOWN_PREFIX_CHARS, len(key) // 2)]


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(30)


@dataclass(frozen=True)
class KeyIdentity:
    key_id: str
    tenant_id: str


class ApiKeys:
    def __init__(self, db: Database, hmac_secret: str) -> None:
        self._db = db
        self._secret = hmac_secret.encode()

    @classmethod
    async def open(cls, db: Database) -> ApiKeys:
        secret = await db.meta("api_key_hmac_secret")
        if not secret:
            raise RuntimeError("api key secret missing from the database; migrations did not run")
        return cls(db, secret)

    def hash(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()

    async def verify(self, key: str) -> KeyIdentity | None:
        query = select(ApiKey.id, ApiKey.tenant_id).where(ApiKey.key_hash == self.hash(key))
        row = await self._db.run_read(lambda s: s.execute(query).first())  # one hop, as the reads below
        return KeyIdentity(row[0], row[1]) if row else None

    async def add(self, key: str, tenant_id: str, label: str | None, source: str) -> str:
        digest = self.hash(key)
        async with self._db.tx() as s:
            existing = (await s.execute(select(ApiKey.id).where(ApiKey.key_hash == digest))).scalar_one_or_none()
            if existing:
                return existing
            row = ApiKey(tenant_id=tenant_id, label=label, key_hash=digest, key_prefix=shown_prefix(key), source=source)
            s.add(row)
            await s.flush()
            return row.id

    async def mint(self, tenant_id: str, label: str | None, source: str = "api") -> tuple[str, str]:
        key = generate_key()
        key_id = await self.add(key, tenant_id, label, source)
        return key_id, key

    async def count(self) -> int:
        return len(await self._db.run_read(lambda s: s.execute(select(ApiKey.id).limit(1)).all()))

    async def list(self, tenant_id: str) -> list[dict[str, str | None]]:
        query = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
        rows = await self._db.run_read(lambda s: s.execute(query).scalars().all())
        return [
            {"id": r.id, "label": r.label, "keyPrefix": r.key_prefix, "createdAt": iso(r.created_at),
             "lastUsedAt": iso(r.last_used_at)}
            for r in rows
        ]

    async def delete(self, tenant_id: str, key_id: str) -> None:
        """Revoke a key of `tenant_id` (the row goes: a revoked key cannot come back by itself).

        The SERVICE_API_KEY key is refused with a Conflict: the next start would register it again,
        so only changing the setting revokes it.
        """
        async with self._db.tx() as s:
            source = (await s.execute(
                select(ApiKey.source).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
            )).scalar_one_or_none()
            if source is None:
                raise NotFound(f"API key {key_id} not found")
            if source == ENV_SOURCE:
                raise Conflict(
                    "This key is set by SERVICE_API_KEY and cannot be revoked through the API; "
                    "change or unset SERVICE_API_KEY and restart the server (the old key is revoked "
                    "at start)"
                )
            await s.execute(delete(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id))

    async def retire_env_keys(self, keep: str | None) -> int:
        """Remove keys an earlier SERVICE_API_KEY registered, except `keep` (the current one)."""
        query = delete(ApiKey).where(ApiKey.source == ENV_SOURCE)
        if keep is not None:
            query = query.where(ApiKey.id != keep)
        async with self._db.tx() as s:
            result = await s.execute(query)
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def touch(self, key_id: str) -> None:
        async with self._db.tx() as s:
            await s.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=utcnow()))
