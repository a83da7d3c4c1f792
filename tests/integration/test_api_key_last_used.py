"""An API key's `lastUsedAt`: null until the key authenticates a request, then the time of its use."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.conftest import Api


async def test_last_used_at_is_set_when_the_key_authenticates(api: Api) -> None:
    before = datetime.now(UTC)
    key = await api.new_tenant_key("acme")
    status, body = await api.call("GET", "/api/api-keys", key=key)  # this very request uses it
    assert status == 200, body
    (listed,) = body["keys"]
    assert listed["lastUsedAt"] is not None
    used = datetime.fromisoformat(listed["lastUsedAt"].replace("Z", "+00:00"))
    assert used >= before.replace(microsecond=(before.microsecond // 1000) * 1000)

    unused = await api.new_tenant_key("acme")
    status, body = await api.call("GET", "/api/api-keys", key=key)
    assert status == 200
    fresh = [k for k in body["keys"] if k["lastUsedAt"] is None]
    assert len(fresh) == 1 and unused.startswith(fresh[0]["keyPrefix"])
