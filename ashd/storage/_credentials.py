"""Credentials: secrets a tenant stores once and names by id when creating sessions.

The secret is encrypted with AES-256-GCM (`Cipher`) and bound to its row: the associated data is
`credential:<tenant>:<id>`, so a ciphertext copied onto another row or tenant does not decrypt.
Nothing here returns the secret except `use_credential`, which session code calls at injection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlalchemy import delete, select, update

from ashd.errors import BadRequest, NotFound
from ashd.storage._crypto import Cipher
from ashd.storage._database import Database
from ashd.storage._models import Credential, iso, new_id, utcnow

log = logging.getLogger(__name__)

TYPES = ("anthropic", "openai", "bedrock", "custom")
MAX_KEY_CHARS = 16 * 1024
_BEDROCK_REQUIRED = ("accessKeyId", "secretAccessKey", "region")
_BEDROCK_FIELDS = (*_BEDROCK_REQUIRED, "sessionToken")
# The variable each simple type is injected as (decisions.md, "Credentials").
_ENV_NAME = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "custom": "SERVICE_CUSTOM_API_KEY"}


@dataclass(frozen=True)
class CredentialRecord:
    id: str
    tenant_id: str
    type: str
    label: str | None
    created_at: str | None
    last_used_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "tenantId": self.tenant_id, "type": self.type, "label": self.label,
                "active": True, "createdAt": self.created_at, "lastUsedAt": self.last_used_at}


@dataclass(frozen=True)
class ResolvedCredential:
    """A credential ready to inject: `env` holds the variables for its type. For `anthropic` the
    session code hands the key to the model proxy instead of the sandbox environment."""

    id: str
    type: str
    secret: str = field(repr=False)
    env: Mapping[str, str] = field(repr=False)


def _aad(tenant: str, credential_id: str) -> bytes:
    return f"credential:{tenant}:{credential_id}".encode()


def _record(row: Credential) -> CredentialRecord:
    return CredentialRecord(id=row.id, tenant_id=row.tenant_id, type=row.type, label=row.label,
                            created_at=iso(row.created_at), last_used_at=iso(row.last_used_at))


def _check_simple_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip():
        raise BadRequest("`key` is required: a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise BadRequest(f"`key` is longer than {MAX_KEY_CHARS} characters")
    secret = str(key).strip()
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in secret):
        raise BadRequest("`key` must not contain line breaks or other control characters")
    return secret


def _check_bedrock_key(key: Any) -> str:
    """The normalised JSON of a bedrock key: `{accessKeyId, secretAccessKey, region, sessionToken?}`,
    given as an object or as a JSON string of one."""
    if isinstance(key, str):
        if len(key) > MAX_KEY_CHARS:
            raise BadRequest(f"`key` is longer than {MAX_KEY_CHARS} characters")
        try:
            key = json.loads(key)
        except json.JSONDecodeError as exc:
            raise BadRequest(
                "a bedrock `key` must be a JSON object {accessKeyId, secretAccessKey, region, sessionToken?} "
                "or a string holding one; the string given is not valid JSON"
            ) from exc
    if not isinstance(key, dict):
        raise BadRequest(
            "a bedrock `key` must be an object {accessKeyId, secretAccessKey, region, sessionToken?}"
        )
    unknown = sorted(set(key) - set(_BEDROCK_FIELDS))
    if unknown:
        raise BadRequest(
            f"a bedrock `key` accepts only {', '.join(_BEDROCK_FIELDS)}; unknown: {', '.join(unknown)}"
        )
    missing = [k for k in _BEDROCK_REQUIRED if not isinstance(key.get(k), str) or not key[k].strip()]
    if missing:
        raise BadRequest(f"a bedrock `key` needs non-empty strings {', '.join(missing)}")
    token = key.get("sessionToken")
    if token is not None and not isinstance(token, str):
        raise BadRequest("bedrock `sessionToken` must be a string")
    for name, value in key.items():
        if value is not None and any(ord(c) < 0x20 for c in value):
            raise BadRequest(f"bedrock `{name}` must not contain line breaks or other control characters")
    return json.dumps({k: key[k].strip() for k in _BEDROCK_FIELDS if key.get(k)}, sort_keys=True)


def check_type(value: Any) -> str:
    if value not in TYPES:
        raise BadRequest(f"`type` must be one of {', '.join(TYPES)}")
    return str(value)


def normalise_secret(kind: str, key: Any) -> str:
    """The secret as stored, or BadRequest saying what is wrong with `key`."""
    return _check_bedrock_key(key) if kind == "bedrock" else _check_simple_key(key)


def env_for(kind: str, secret: str) -> dict[str, str]:
    if kind != "bedrock":
        return {_ENV_NAME[kind]: secret}
    value = json.loads(secret)
    env = {"AWS_ACCESS_KEY_ID": value["accessKeyId"], "AWS_SECRET_ACCESS_KEY": value["secretAccessKey"],
           "AWS_REGION": value["region"]}
    if value.get("sessionToken"):
        env["AWS_SESSION_TOKEN"] = value["sessionToken"]
    return env


class Credentials:
    def __init__(self, db: Database, cipher: Cipher) -> None:
        self._db = db
        self._cipher = cipher

    async def create(self, tenant: str, kind: Any, key: Any, label: str | None) -> CredentialRecord:
        kind = check_type(kind)
        secret = normalise_secret(kind, key)
        credential_id = new_id()
        row = Credential(id=credential_id, tenant_id=tenant, type=kind, label=label, created_at=utcnow(),
                         secret_ciphertext=self._cipher.encrypt(secret.encode(), _aad(tenant, credential_id)))
        async with self._db.tx() as s:
            s.add(row)
            await s.flush()
            record = _record(row)
        log.info("credential stored", extra={"credentialId": credential_id, "type": kind})
        return record

    async def list(self, tenant: str) -> list[CredentialRecord]:
        query = select(Credential).where(Credential.tenant_id == tenant).order_by(Credential.created_at)
        rows = await self._db.run_read(lambda s: s.execute(query).scalars().all())  # one hop
        return [_record(r) for r in rows]

    async def get(self, tenant: str, credential_id: str) -> CredentialRecord:
        query = select(Credential).where(Credential.id == credential_id, Credential.tenant_id == tenant)
        row = await self._db.run_read(lambda s: s.execute(query).scalar_one_or_none())
        if row is None:
            raise NotFound(f"Credential {credential_id} not found")
        return _record(row)

    async def delete(self, tenant: str, credential_id: str) -> None:
        async with self._db.tx() as s:
            result = await s.execute(
                delete(Credential).where(Credential.id == credential_id, Credential.tenant_id == tenant)
            )
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"Credential {credential_id} not found")

    async def use(self, tenant: str, credential_id: str) -> ResolvedCredential:
        async with self._db.tx() as s:
            row = (await s.execute(
                update(Credential).where(Credential.id == credential_id, Credential.tenant_id == tenant)
                .values(last_used_at=utcnow()).returning(Credential.type, Credential.secret_ciphertext)
            )).first()
        if row is None:
            raise NotFound(f"Credential {credential_id} not found")
        kind, blob = row[0], row[1]
        secret = self._cipher.decrypt(blob, _aad(tenant, credential_id)).decode()
        return ResolvedCredential(id=credential_id, type=kind, secret=secret,
                                  env=MappingProxyType(env_for(kind, secret)))
