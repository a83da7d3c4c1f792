"""AES-256-GCM for secrets at rest (credentials, agent env, session extraEnv)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ashd.errors import ConfigError

_NONCE = 12
_VERSION = b"\x01"


def _parse_key(raw: str) -> bytes:
    raw = raw.strip()
    try:
        if len(raw) == 64:
            return binascii.unhexlify(raw)
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError("SERVICE_CREDENTIAL_KEY must be 64 hex characters or base64 of 32 bytes") from exc
    if len(key) != 32:
        raise ConfigError("SERVICE_CREDENTIAL_KEY must decode to exactly 32 bytes")
    return key


def load_or_create_key(configured: str | None, data_dir: Path) -> bytes:
    if configured:
        return _parse_key(configured)
    path = data_dir / "credential-key"
    if path.exists():
        return _parse_key(path.read_text())
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex() + "\n")
    return key


class Cipher:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def encrypt(self, plaintext: bytes, aad: bytes = b"") -> bytes:
        nonce = secrets.token_bytes(_NONCE)
        return _VERSION + nonce + self._aead.encrypt(nonce, plaintext, aad)

    def decrypt(self, blob: bytes, aad: bytes = b"") -> bytes:
        if not blob or blob[:1] != _VERSION:
            raise ValueError("unknown ciphertext version")
        return self._aead.decrypt(blob[1 : 1 + _NONCE], blob[1 + _NONCE :], aad)

    def encrypt_json(self, value: Any, aad: bytes = b"") -> bytes:
        return self.encrypt(json.dumps(value).encode(), aad)

    def decrypt_json(self, blob: bytes | None, aad: bytes = b"") -> Any:
        if blob is None:
            return None
        return json.loads(self.decrypt(blob, aad))
