"""The cache of verified API keys (http/_key_cache.py): what a revoked key and a busy server rely on.

A revoked key stops working on every server within the cache's 5 seconds (docs/cli.md): an entry
must expire, and must not expire so early that every request pays a database round trip. The
clock is the module's own, stepped by the test, so no assertion depends on how fast this runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ashd.http import _key_cache
from ashd.http._key_cache import KeyCache
from ashd.storage import KeyIdentity

ALICE = KeyIdentity(key_id="k-alice", tenant_id="acme")
BOB = KeyIdentity(key_id="k-bob", tenant_id="globex")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_key_cache, "time", SimpleNamespace(monotonic=clock.monotonic))
    return clock


def test_an_unknown_key_is_not_cached(clock: Clock) -> None:
    cache = KeyCache()
    assert cache.get("ashd_never_seen") is None
    cache.put("ashd_alice", ALICE)
    assert cache.get("ashd_alice_but_longer") is None


def test_a_verified_key_is_remembered_for_five_seconds_then_checked_again(clock: Clock) -> None:
    cache = KeyCache()
    cache.put("ashd_alice", ALICE)
    clock.now += 4.9
    assert cache.get("ashd_alice") == ALICE  # still within the 5 s: no database round trip
    clock.now += 0.2
    assert cache.get("ashd_alice") is None  # past them: verified against the database again
    clock.now += 0.1
    assert cache.get("ashd_alice") is None  # and stays gone until it is put again


def test_putting_a_key_again_renews_its_five_seconds(clock: Clock) -> None:
    cache = KeyCache()
    cache.put("ashd_alice", ALICE)
    clock.now += 4.0
    cache.put("ashd_alice", ALICE)
    clock.now += 4.0
    assert cache.get("ashd_alice") == ALICE


def test_forgetting_a_key_id_drops_its_keys_only(clock: Clock) -> None:
    cache = KeyCache()
    cache.put("ashd_alice", ALICE)
    cache.put("ashd_alice_second_copy", ALICE)
    cache.put("ashd_bob", BOB)
    cache.forget(ALICE.key_id)  # revoked on this server: refused at once, not after 5 s
    assert cache.get("ashd_alice") is None
    assert cache.get("ashd_alice_second_copy") is None
    assert cache.get("ashd_bob") == BOB
    cache.forget("k-unknown")  # revoking a key never cached changes nothing
    assert cache.get("ashd_bob") == BOB


def test_the_cache_never_holds_more_than_its_maximum(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # A flood of distinct valid keys must not grow the server's memory without bound.
    monkeypatch.setattr(_key_cache, "_CACHE_MAX", 3)
    cache = KeyCache()
    keys = [f"ashd_key_{i}" for i in range(4)]
    for key in keys:
        cache.put(key, ALICE)
    held = [key for key in keys if cache.get(key) is not None]
    assert 1 <= len(held) <= 3
    assert keys[-1] in held  # the key just verified is the one kept


def test_the_maximum_is_ten_thousand_keys(clock: Clock) -> None:
    cache = KeyCache()
    keys = [f"ashd_key_{i}" for i in range(10_001)]
    for key in keys[:10_000]:
        cache.put(key, ALICE)
    assert cache.get(keys[0]) is not None and cache.get(keys[9_999]) is not None  # all 10 000 held
    cache.put(keys[10_000], ALICE)
    assert cache.get(keys[0]) is None  # the 10 001st does not grow it further
    assert cache.get(keys[10_000]) is not None
