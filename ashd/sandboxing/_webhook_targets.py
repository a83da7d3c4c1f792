"""Where webhooks may be delivered: the sandbox egress rules, applied to the server's own requests.

A webhook makes the server send a request to an address a tenant chose, so without a rule a tenant
could reach what only the server can reach: its loopback, the cloud metadata service, private
networks. The rule is the sandboxes' (docs/security.md, "Network"): public addresses only, except
what the operator lists in SERVICE_SANDBOX_EGRESS_ALLOW or, for webhooks alone (loopback included,
which sandboxes can never reach), SERVICE_WEBHOOK_ALLOW.

It is checked at registration on the addresses the host name resolves to, and again at every
delivery on the addresses the connection will use (a name that resolved to a public address at
registration may resolve to 127.0.0.1 later: DNS rebinding). The delivery connects to exactly the
addresses that were checked (GuardedResolver), never resolving the name a second time.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from ashd.errors import BadRequest
from ashd.sandboxing._egress_policy import BLOCKED_V4, parse_allow

Network = IPv4Network | IPv6Network
_BLOCKED = tuple((IPv4Network(net), why) for net, why in BLOCKED_V4)


class TargetRefused(Exception):
    """The address is not one webhooks may reach; the message says why and what would allow it."""


@dataclass(frozen=True)
class AllowedNet:
    network: Network
    port: int | None = None

    def admits(self, addr: IPv4Address | IPv6Address, port: int) -> bool:
        return addr.version == self.network.version and addr in self.network and self.port in (None, port)


def parse_webhook_allow(text: str) -> tuple[AllowedNet, ...]:
    """`addr`, `cidr`, `addr:port` (IPv4) or `[v6addr]:port`, separated by `,` or spaces."""
    out: list[AllowedNet] = []
    for item in (p.strip() for p in text.replace(" ", ",").split(",")):
        if not item:
            continue
        host, port_text = item, ""
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        port: int | None = None
        if port_text:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise ValueError(f"{item!r}: the port must be 1-65535")
            port = int(port_text)
        try:
            net = ip_network(host, strict=False)
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network (CIDR), optionally with :port") from None
        out.append(AllowedNet(net, port))
    return tuple(out)


@dataclass(frozen=True)
class WebhookTargets:
    allow: tuple[AllowedNet, ...] = ()

    @classmethod
    def parse(cls, sandbox_egress_allow: str | None, webhook_allow: str | None) -> WebhookTargets:
        sandbox = tuple(AllowedNet(e.network, e.port) for e in parse_allow(sandbox_egress_allow or ""))
        return cls(sandbox + parse_webhook_allow(webhook_allow or ""))

    def refusal(self, address: str, port: int) -> str | None:
        """Why `address:port` may not receive webhooks, or None when it may."""
        addr = ip_address(address.split("%")[0])
        if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if any(a.admits(addr, port) for a in self.allow):
            return None
        if isinstance(addr, IPv4Address):
            why = next((w for net, w in _BLOCKED if addr in net), None)
        else:
            why = None if addr.is_global else "non-public IPv6 (loopback, link-local, unique-local or reserved)"
        if why is None:
            return None
        return (f"{addr} is {why}: webhooks follow the sandbox egress rules and reach public addresses only; "
                f"an operator can allow it with SERVICE_WEBHOOK_ALLOW (or SERVICE_SANDBOX_EGRESS_ALLOW)")

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses `host` resolves to, each checked: TargetRefused names the first refused one."""
        try:
            literal = ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError, ValueError) as exc:  # UnicodeError: a name IDNA cannot encode
                raise TargetRefused(f"the host {host!r} does not resolve: {exc}") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            why = self.refusal(address, port)
            if why is not None:
                raise TargetRefused(f"{host} resolves to {why}" if literal is None else why)
        return addresses

    async def check_url(self, url: str) -> None:
        """At registration: a 400 saying what is wrong with `url`, or nothing."""
        host, port = split_url(url)
        try:
            await self.resolve(host, port)
        except TargetRefused as exc:
            raise BadRequest(f"`url` is refused: {exc}") from None


def split_url(url: str) -> tuple[str, int]:
    """Host and port of an http(s) URL, or a 400 naming the problem."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadRequest(f"`url` is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("`url` must be an absolute http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise BadRequest("`url` must not carry credentials (user:password@); verify the signature instead")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver for deliveries: every address is checked, and the connection uses only the
    checked ones (a name resolved twice could answer differently the second time)."""

    def __init__(self, targets: WebhookTargets) -> None:
        self._targets = targets
        self._inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for item in found:
            why = self._targets.refusal(item["host"], port)
            if why is not None:
                raise TargetRefused(f"{host} resolves to {why}")
        return found

    async def close(self) -> None:
        await self._inner.close()


def describe_failure(exc: BaseException) -> str:
    """A short, actionable text for a failed attempt (stored in lastError)."""
    seen: Any = exc
    while seen is not None:
        if isinstance(seen, TargetRefused):
            return f"refused: {seen}"
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out waiting for the receiver"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
