"""Where webhooks may go (the sandbox egress rules plus SERVICE_WEBHOOK_ALLOW), and their signature."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from ashd.actors import sign
from ashd.config import load_settings
from ashd.errors import BadRequest, ConfigError
from ashd.sandboxing import GuardedResolver, TargetRefused, WebhookTargets, parse_webhook_allow, split_url


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("169.254.169.254", "metadata"), ("10.0.0.8", "private"),
    ("192.168.1.1", "private"), ("100.100.100.200", "carrier-grade NAT"), ("::1", "non-public IPv6"),
    ("fe80::1", "non-public IPv6"), ("fd00::1", "non-public IPv6"), ("::ffff:127.0.0.1", "loopback"),
])
def test_non_public_addresses_are_refused(address: str, why: str) -> None:
    refusal = WebhookTargets().refusal(address, 443)
    assert refusal is not None and why in refusal and "SERVICE_WEBHOOK_ALLOW" in refusal


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert WebhookTargets().refusal(address, 443) is None


def test_allow_lists_open_addresses_and_ports() -> None:
    targets = WebhookTargets.parse("10.1.2.0/24:443", "127.0.0.1:9000,[::1]:8080,192.168.0.0/16")
    assert targets.refusal("10.1.2.7", 443) is None and targets.refusal("10.1.2.7", 80) is not None
    assert targets.refusal("127.0.0.1", 9000) is None and targets.refusal("127.0.0.1", 9001) is not None
    assert targets.refusal("::1", 8080) is None and targets.refusal("192.168.44.1", 1) is None
    with pytest.raises(ValueError, match="port"):
        parse_webhook_allow("127.0.0.1:0")
    with pytest.raises(ValueError, match="not an IP"):
        parse_webhook_allow("localhost")


def test_the_setting_is_validated() -> None:
    assert load_settings({"SERVICE_WEBHOOK_ALLOW": "127.0.0.1:9000"}).webhook_allow == "127.0.0.1:9000"
    with pytest.raises(ConfigError, match="SERVICE_WEBHOOK_ALLOW"):
        load_settings({"SERVICE_WEBHOOK_ALLOW": "not-an-address"})


def test_urls() -> None:
    assert split_url("https://hooks.example.com/x") == ("hooks.example.com", 443)
    assert split_url("http://[::1]:8080/x") == ("::1", 8080)
    for bad in ("ftp://x/", "/relative", "http://u:p@x/", "http://x:99999/"):
        with pytest.raises(BadRequest):
            split_url(bad)


async def test_a_name_is_checked_on_every_address_it_resolves_to() -> None:
    with pytest.raises(TargetRefused, match="localhost resolves to .*loopback"):
        await WebhookTargets().resolve("localhost", 80)
    with pytest.raises(TargetRefused, match="does not resolve"):
        await WebhookTargets().resolve("a" * 70 + ".example.com", 80)  # a label IDNA cannot encode
    resolver = GuardedResolver(WebhookTargets())
    try:
        with pytest.raises(TargetRefused, match="loopback"):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()
    allowed = GuardedResolver(WebhookTargets.parse(None, "127.0.0.1,::1"))
    try:
        assert {r["host"] for r in await allowed.resolve("localhost", 80)} <= {"127.0.0.1", "::1"}
    finally:
        await allowed.close()


def test_signature_is_hmac_sha256_of_timestamp_and_body() -> None:
    body = '{"event":"turn.completed"}'
    expected = hmac.new(b"whsec_k", b"1700000000." + body.encode(), hashlib.sha256).hexdigest()
    assert sign("whsec_k", "1700000000", body) == f"v1={expected}"
