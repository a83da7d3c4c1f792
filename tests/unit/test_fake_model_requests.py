"""The fake model's record of requests: all of them in process (tests read them), the latest ones
when it runs on its own, where a day of offline development would otherwise keep every conversation."""

from __future__ import annotations

import aiohttp

from ashd.devtools.fake_model import FakeModel


async def _count_tokens(fake: FakeModel, n: int) -> None:
    async with aiohttp.ClientSession() as http:
        for i in range(n):
            body = {"model": "m", "messages": [{"role": "user", "content": f"request {i}"}]}
            async with http.post(f"{fake.url}/v1/messages/count_tokens", json=body) as resp:
                assert resp.status == 200


async def test_a_bounded_fake_keeps_the_latest_requests() -> None:
    fake = FakeModel(keep_requests=2)
    await fake.start()
    try:
        await _count_tokens(fake, 3)
        assert [r["body"]["messages"][0]["content"] for r in fake.requests] == ["request 1", "request 2"]
        assert fake.requests_containing("request 0") == []
    finally:
        await fake.stop()


async def test_the_fake_in_process_keeps_every_request() -> None:
    fake = FakeModel()
    await fake.start()
    try:
        await _count_tokens(fake, 5)
        assert len(fake.requests) == 5
    finally:
        await fake.stop()
