"""What a networked sandbox may reach, as data: the address plan and the nftables ruleset.

No host access here, so the policy can be read and unit-tested as text. The rules, in order, for
a packet a sandbox sends (docs/security.md, "Network", says why each exists):

1. IPv6 is dropped: a sandbox has IPv4 only, so no v6 path has to be filtered twice.
2. A source address that is not the sandbox's own (spoofing) is dropped.
3. Other sandboxes (of any ashd on the host) and the sandbox subnet are refused.
4. Replies of allowed flows pass; a sandbox holds at most MAX_CONNECTIONS tracked flows, because
   the host's conntrack table is shared by every tenant and the host itself.
5. DNS to the configured resolvers (port 53 only), then the operator's allowlist, pass.
6. Non-public destinations (private, loopback, link-local with cloud metadata, CGNAT, reserved,
   multicast) and the networks the host's own interfaces sit on are refused.
7. Anything else (the public internet) passes unless public egress is switched off.

Packets to the host itself (any of its addresses, so the server's port and PostgreSQL on every
address) never reach the forward path: they are delivered locally and refused on input, except DNS
to a resolver that is one of the host's addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from pathlib import Path

DEFAULT_SUBNET = "10.213.0.0/16"
# Tracked flows (TCP connections, UDP and ICMP "connections") one sandbox may hold at once.
MAX_CONNECTIONS = 1024
# Every sandbox's host-side veth is named IFNAME_PREFIX + <7-hex server key> + <4-hex slot>.
IFNAME_PREFIX = "ashv"
MAX_SLOTS = 0x10000

# Destinations that are not the public internet (IANA special-purpose registry, IPv4).
BLOCKED_V4: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT; also Alibaba Cloud's metadata 100.100.100.200"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local; cloud metadata 169.254.169.254"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved and limited broadcast"),
)
# Destinations no rule can open: the kernel never forwards them, and saying so beats a silent no.
_NEVER = (ip_network("0.0.0.0/8"), ip_network("127.0.0.0/8"), ip_network("224.0.0.0/4"),
          ip_network("240.0.0.0/4"))


@dataclass(frozen=True)
class AllowEntry:
    """An operator's exception: a network, optionally one TCP/UDP port on it."""

    network: IPv4Network
    port: int | None = None

    def __str__(self) -> str:
        net = str(self.network.network_address) if self.network.prefixlen == 32 else str(self.network)
        return net if self.port is None else f"{net}:{self.port}"


@dataclass(frozen=True)
class EgressPolicy:
    subnet: IPv4Network = field(default_factory=lambda: IPv4Network(DEFAULT_SUBNET))
    # None: the host's own resolvers (see host_resolvers); () : no DNS at all.
    dns: tuple[IPv4Address, ...] | None = None
    allow: tuple[AllowEntry, ...] = ()
    public: bool = True

    @classmethod
    def parse(cls, *, subnet: str = DEFAULT_SUBNET, dns: str | None = None, allow: str | None = None,
              public: bool = True) -> EgressPolicy:
        # An allow entry that covers the sandbox subnet does not open it: that rule comes first.
        return cls(parse_subnet(subnet), None if dns is None else parse_dns(dns), parse_allow(allow or ""), public)

    @property
    def slots(self) -> int:
        return min(MAX_SLOTS, self.subnet.num_addresses // 2)

    def addresses(self, slot: int) -> tuple[IPv4Address, IPv4Address]:
        """(host side, sandbox side) of slot's /31."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} outside {self.subnet}")
        host = self.subnet.network_address + 2 * slot
        return host, host + 1


# -- parsing (also used by ashd.config to validate the SERVICE_* values) ------------------------------


def parse_subnet(text: str) -> IPv4Network:
    try:
        net = ip_network(text.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an IPv4 network in CIDR form: {exc}") from None
    if not isinstance(net, IPv4Network):
        raise ValueError(f"{text!r}: sandboxes get IPv4 addresses only")
    if not 8 <= net.prefixlen <= 30:
        raise ValueError(f"{text!r}: use a prefix between /8 and /30 (each sandbox takes a /31)")
    if not any(net.subnet_of(IPv4Network(b)) for b, _ in BLOCKED_V4 if b not in ("224.0.0.0/4", "240.0.0.0/4")):
        raise ValueError(f"{text!r} is public address space: pick a private range such as {DEFAULT_SUBNET}")
    if any(net.overlaps(n) for n in _NEVER):
        raise ValueError(f"{text!r} overlaps loopback, multicast or reserved space")
    return net


def parse_dns(text: str) -> tuple[IPv4Address, ...]:
    out: list[IPv4Address] = []
    for item in _items(text):
        try:
            addr = ip_address(item)
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address") from None
        if not isinstance(addr, IPv4Address):
            raise ValueError(f"{item!r}: sandboxes have IPv4 only, give an IPv4 resolver")
        if any(addr in n for n in _NEVER):
            raise ValueError(f"{item!r} is loopback or reserved: a sandbox cannot reach it (its own "
                             "loopback is not the host's); give a resolver on a network address")
        out.append(addr)
    return tuple(out)


def parse_allow(text: str) -> tuple[AllowEntry, ...]:
    out: list[AllowEntry] = []
    for item in _items(text):
        host, sep, port_text = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        port: int | None = None
        if sep:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise ValueError(f"{item!r}: the port must be 1-65535")
            port = int(port_text)
        try:
            net = ip_network(host, strict=False)
        except ValueError:
            raise ValueError(f"{item!r} is not an IPv4 address or network (CIDR), optionally with :port") from None
        if not isinstance(net, IPv4Network):
            raise ValueError(f"{item!r}: sandboxes have IPv4 only")
        if any(net.overlaps(n) for n in _NEVER):
            raise ValueError(f"{item!r} overlaps loopback, multicast or reserved space, which a sandbox can "
                             "never reach")
        out.append(AllowEntry(net, port))
    return tuple(out)


def _items(text: str) -> list[str]:
    return [part.strip() for part in text.replace(" ", ",").split(",") if part.strip()]


# -- the host's resolvers ------------------------------------------------------------------------------


RESOLV_CONF_CANDIDATES = (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf"))


def nameservers(text: str) -> list[IPv4Address]:
    out: list[IPv4Address] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ip_address(parts[1].split("%")[0])
            except ValueError:
                continue
            if isinstance(addr, IPv4Address) and not addr.is_loopback and addr not in out:
                out.append(addr)
    return out


def host_resolvers(candidates: Iterable[Path] = RESOLV_CONF_CANDIDATES) -> tuple[IPv4Address, ...]:
    """The host's IPv4 resolvers a sandbox can reach over the network. A loopback stub (such as
    systemd-resolved's 127.0.0.53) is the sandbox's own loopback, not the host's, so it is skipped
    and systemd-resolved's upstream list is used instead, as Docker does."""
    for path in candidates:
        try:
            found = nameservers(path.read_text())
        except OSError:
            continue
        if found:
            return tuple(found)
    return ()


def resolv_conf(servers: Sequence[IPv4Address]) -> str:
    """The sandbox's /etc/resolv.conf: the resolvers only, no search domains of the host."""
    if not servers:
        return "# ashd: no DNS resolver is configured for sandboxes (SERVICE_SANDBOX_NETWORK_DNS)\n"
    return "".join(f"nameserver {s}\n" for s in servers) + "options timeout:2 attempts:2\n"


# -- the nftables ruleset ------------------------------------------------------------------------------


def _elements(items: Iterable[object]) -> str:
    return ", ".join(str(i) for i in items)


def ruleset(table: str, server_ifglob: str, policy: EgressPolicy, dns: Sequence[IPv4Address],
            host_networks: Sequence[IPv4Network] = ()) -> str:
    """One nft script that (re)creates `inet <table>` atomically.

    `server_ifglob` matches this server's sandbox veths; `host_networks` are the networks the host's
    interfaces sit on (blocked like private ranges, since the host's neighbours often trust it).
    """
    any_sandbox = f'"{IFNAME_PREFIX}*"'
    ours = f'"{server_ifglob}"'
    reject = "reject with icmp admin-prohibited"
    blocked = [b for b, _ in BLOCKED_V4] + [str(n) for n in host_networks]
    whole = [e for e in policy.allow if e.port is None]
    ported = [e for e in policy.allow if e.port is not None]
    dns_rule = "ip daddr @dns meta l4proto { tcp, udp } th dport 53 accept"
    lines = [
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "  set blocked { type ipv4_addr; flags interval; auto-merge; elements = { " + _elements(blocked) + " } }",
        "  set conns { type ipv4_addr; size 65535; flags dynamic; }",
    ]
    if dns:
        lines.append("  set dns { type ipv4_addr; elements = { " + _elements(dns) + " } }")
    if whole:
        lines.append("  set allow { type ipv4_addr; flags interval; auto-merge; elements = { "
                     + _elements(e.network for e in whole) + " } }")
    lines += [
        "  chain forward {",
        "    type filter hook forward priority filter - 5; policy accept;",
        f"    iifname {ours} jump egress",
        # Nothing may open a connection into a sandbox; replies to its own flows come back.
        f"    oifname {ours} ct state established,related accept",
        f"    oifname {ours} drop",
        "  }",
        "  chain egress {",
        "    meta nfproto != ipv4 drop",
        "    fib saddr . iif oif missing drop",
        f"    oifname {any_sandbox} {reject}",
        f"    ip daddr {policy.subnet} {reject}",
        "    ct state established,related accept",
        f"    ct state new add @conns {{ ip saddr ct count over {MAX_CONNECTIONS} }} {reject}",
    ]
    if dns:
        lines.append(f"    {dns_rule}")
    if whole:
        lines.append("    ip daddr @allow accept")
    for e in ported:
        lines.append(f"    ip daddr {e.network} meta l4proto {{ tcp, udp }} th dport {e.port} accept")
    lines += [
        f"    ip daddr @blocked {reject}",
        "    accept" if policy.public else f"    {reject}",
        "  }",
        "  chain input {",
        "    type filter hook input priority filter - 5; policy accept;",
        f"    iifname {ours} jump to_host",
        "  }",
        "  chain to_host {",
    ]
    if dns:
        lines.append(f"    meta nfproto ipv4 {dns_rule}")
    lines += [
        f"    meta nfproto ipv4 {reject}",
        "    drop",
        "  }",
        "  chain postrouting {",
        "    type nat hook postrouting priority srcnat; policy accept;",
        f"    ip saddr {policy.subnet} oifname != {any_sandbox} masquerade",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


GUARD_TABLE = "ashd_forward_guard"


def guard_ruleset() -> str:
    """Installed only when ashd itself switched IPv4 forwarding on: the host then forwards nothing
    but sandbox traffic, as before (the same trade Docker makes with its FORWARD policy)."""
    any_sandbox = f'"{IFNAME_PREFIX}*"'
    return "\n".join([
        f"table inet {GUARD_TABLE}",
        f"delete table inet {GUARD_TABLE}",
        f"table inet {GUARD_TABLE} {{",
        "  chain forward {",
        "    type filter hook forward priority filter - 10; policy accept;",
        f"    iifname {any_sandbox} accept",
        f"    oifname {any_sandbox} accept",
        "    drop",
        "  }",
        "}",
    ]) + "\n"
