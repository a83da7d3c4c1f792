"""The cache of verified API keys: a request does not pay a database round trip for a key checked
within the last `_CACHE_TTL` seconds. A key revoked on this server is forgotten at once; one revoked
through another coordinator stops working when its entry expires."""

from __future__ import annotations

import time

from ashd.storage import KeyIdentity

_CACHE_TTL = 5.0
_CACHE_MAX = 10_000


class KeyCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, KeyIdentity]] = {}

    def get(self, key: str) -> KeyIdentity | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            del self._entries[key]
            return None
        return hit[1]

    def put(self, key: str, identity: KeyIdentity) -> None:
        if len(self._entries) >= _CACHE_MAX:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + _CACHE_TTL, identity)

    def forget(self, key_id: str) -> None:
        for key, (_, ident) in list(self._entries.items()):
            if ident.key_id == key_id:
                del self._entries[key]
