"""Networked sandboxes: their namespaces, addresses and the egress firewall, owned per server.

Everything this server puts on the host is named by a key derived from its data dir, so two
servers (or two test runs) on one host never touch each other's objects:

    nft table     inet ashd_<key>                 the egress rules and the NAT (created on the
                                                  first networked sandbox, removed at stop)
    netns         /run/netns/ashd-<key>-<sandbox> one per networked sandbox
    veth          ashv<key><slot>                 host side of that sandbox's link
    lock          /run/ashd/net-<key>.lock        held while the server runs

At start the server sweeps what a dead server left: its own leftovers, and those of any key whose
lock nobody holds. Host-wide steps (IPv4 forwarding, the sweep) run under /run/ashd/net.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, ip_network
from pathlib import Path

from pyroute2 import IPRoute

from ashd.errors import SandboxError
from ashd.sandboxing import _netns as netns
from ashd.sandboxing import _nft as nft
from ashd.sandboxing._cgroups import data_dir_key
from ashd.sandboxing._egress_policy import (
    GUARD_TABLE,
    IFNAME_PREFIX,
    EgressPolicy,
    guard_ruleset,
    host_resolvers,
    ruleset,
)
from ashd.sandboxing._netns import SandboxLink

log = logging.getLogger(__name__)

RUN_DIR = Path("/run/ashd")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
KEY_LEN = 7
_TABLE = re.compile(r"^ashd_([0-9a-f]{7})$")
_NETNS = re.compile(r"^ashd-([0-9a-f]{7})-")
_LINK = re.compile(rf"^{IFNAME_PREFIX}([0-9a-f]{{7}})[0-9a-f]{{4}}$")
CANDIDATES = 256


def network_key(data_dir: Path) -> str:
    return data_dir_key(data_dir)[:KEY_LEN]


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    RUN_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(RUN_DIR / "net.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _try_liveness_lock(key: str) -> int | None:
    """The key's lock fd when nobody holds it (its server is dead or never ran), else None."""
    RUN_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(RUN_DIR / f"net-{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class SandboxNetworking:
    def __init__(self, data_dir: Path, policy: EgressPolicy) -> None:
        self.policy = policy
        self.key = network_key(data_dir)
        self.table = f"ashd_{self.key}"
        self.ifprefix = f"{IFNAME_PREFIX}{self.key}"
        self.netns_prefix = f"ashd-{self.key}-"
        self.dns: tuple[IPv4Address, ...] = policy.dns if policy.dns is not None else host_resolvers()
        self._data_dir = data_dir
        self._lock = threading.Lock()
        self._links: dict[str, SandboxLink] = {}
        self._cursor = int(self.key, 16) % policy.slots
        self._liveness: int | None = None
        self._firewall = False
        self._unusable: str | None = None

    # -- server start / stop -----------------------------------------------------------------------

    def start(self) -> None:
        with host_lock():
            fd = _try_liveness_lock(self.key)
            if fd is None:
                raise SandboxError(f"another ashd server on this host uses the data dir {self._data_dir}")
            self._liveness = fd
            swept = sweep(own_key=self.key)
        if swept:
            log.warning("removed network leftovers of stopped servers", extra={"count": swept})
        self._unusable = self._check_host()
        if self._unusable:
            log.warning("networked sandboxes cannot start: %s", self._unusable)
        elif not self.dns:
            log.warning("networked sandboxes have no DNS: the host's resolvers are all on loopback; "
                        "set SERVICE_SANDBOX_NETWORK_DNS")

    @property
    def status(self) -> str:
        if self._unusable:
            return f"networked sandboxes unavailable: {self._unusable}"
        return f"own namespace, NAT and egress firewall ({self.policy.subnet})"

    def _check_host(self) -> str | None:
        if nft.nft_path() is None:
            return "nftables is not installed (apt-get install nftables)"
        clash = subnet_clash(self.policy.subnet)
        if clash:
            return (f"SERVICE_SANDBOX_NETWORK_SUBNET={self.policy.subnet} overlaps {clash} on this host; "
                    "choose a private range the host does not use")
        return None

    def stop(self) -> None:
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            self._unplumb(link)
        with host_lock():
            if self._firewall:
                nft.delete_table(self.table)
                restore_forwarding()
                self._firewall = False
            if self._liveness is not None:
                with contextlib.suppress(FileNotFoundError):
                    (RUN_DIR / f"net-{self.key}.lock").unlink()
                os.close(self._liveness)
                self._liveness = None

    # -- per sandbox ---------------------------------------------------------------------------------

    def attach(self, sandbox_id: str) -> SandboxLink:
        """A configured netns for this sandbox, behind the egress firewall."""
        if self._unusable:
            raise SandboxError(f"this sandbox asks for network, but {self._unusable}")
        with self._lock:
            try:
                self._ensure_firewall()
            except OSError as exc:
                raise SandboxError(f"could not set up the sandbox egress firewall: {exc}") from exc
            candidates = self._candidates()
        name = self.netns_prefix + sandbox_id
        try:
            sock = netns.create_netns(name)
        except OSError as exc:
            raise SandboxError(f"could not create the sandbox's network namespace: {exc}") from exc
        try:
            link = netns.plumb(name, sock, self.ifprefix, self.policy, candidates)
        except Exception as exc:
            netns.delete_netns(name)
            raise SandboxError(f"could not connect the sandbox's network: {exc}") from exc
        finally:
            sock.close()
        with self._lock:
            self._links[sandbox_id] = link
            self._cursor = (link.slot + 1) % self.policy.slots
        return link

    def release(self, sandbox_id: str) -> None:
        with self._lock:
            link = self._links.pop(sandbox_id, None)
        if link is not None:
            self._unplumb(link)

    def link(self, sandbox_id: str) -> SandboxLink | None:
        with self._lock:
            return self._links.get(sandbox_id)

    @staticmethod
    def _unplumb(link: SandboxLink) -> None:
        try:
            netns.unplumb(link)
        except Exception:
            log.exception("could not remove a sandbox's network", extra={"netns": link.netns})

    def _candidates(self) -> list[int]:
        used = {link.slot for link in self._links.values()}
        out: list[int] = []
        slot = self._cursor
        for _ in range(self.policy.slots):
            if slot not in used:
                out.append(slot)
                if len(out) == CANDIDATES:
                    break
            slot = (slot + 1) % self.policy.slots
        if not out:
            raise SandboxError(f"every address of SERVICE_SANDBOX_NETWORK_SUBNET={self.policy.subnet} is in use")
        return out

    def _ensure_firewall(self) -> None:
        if self._firewall:
            return
        script = ruleset(self.table, f"{self.ifprefix}*", self.policy, self.dns, host_networks())
        with host_lock():
            nft.apply(script)
            enable_forwarding()
        self._firewall = True
        log.info("sandbox egress firewall installed", extra={"table": f"inet {self.table}",
                                                             "dns": [str(d) for d in self.dns]})


# -- host-wide helpers (call under host_lock) ------------------------------------------------------------


def enable_forwarding() -> None:
    """IPv4 forwarding is one global switch. When it is off, ashd turns it on behind a guard table
    that keeps every other path unforwarded; when it is already on, the host routes by its
    operator's choice and ashd changes nothing else."""
    if IP_FORWARD.read_text().strip() == "1":
        return
    nft.apply(guard_ruleset())
    IP_FORWARD.write_text("1")
    log.warning("IPv4 forwarding switched on for networked sandboxes; table inet %s forwards "
                "nothing else", GUARD_TABLE)


def restore_forwarding() -> None:
    """Once no ashd server's table is left, undo what enable_forwarding did (only if it did it)."""
    tables = nft.tables()
    if GUARD_TABLE not in tables or any(_TABLE.match(t) for t in tables):
        return
    IP_FORWARD.write_text("0")
    nft.delete_table(GUARD_TABLE)
    log.info("IPv4 forwarding switched back off")


def sweep(own_key: str) -> int:
    """Remove the tables, namespaces and veths of our key and of every key whose server is dead."""
    if nft.nft_path() is None:
        tables: list[str] = []
    else:
        tables = nft.tables()
    with IPRoute() as ipr:
        links = [m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()]
    keys: set[str] = set()
    for pattern, names in ((_TABLE, tables), (_NETNS, netns.list_netns("ashd-")), (_LINK, links)):
        keys.update(m.group(1) for m in map(pattern.match, names) if m)
    removed = 0
    for key in sorted(keys):
        fd = None if key == own_key else _try_liveness_lock(key)
        if key != own_key and fd is None:
            continue  # a live server
        try:
            if f"ashd_{key}" in tables:
                nft.delete_table(f"ashd_{key}")
                removed += 1
            removed += netns.delete_links(f"{IFNAME_PREFIX}{key}")
            for name in netns.list_netns(f"ashd-{key}-"):
                netns.delete_netns(name)
                removed += 1
        finally:
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    (RUN_DIR / f"net-{key}.lock").unlink()
                os.close(fd)
    if tables:
        restore_forwarding()
    return removed


def _host_routes() -> list[tuple[IPv4Network, str]]:
    out: list[tuple[IPv4Network, str]] = []
    with IPRoute() as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()}
        for r in ipr.get_routes(family=2, table=254):
            if r["dst_len"] == 0:
                continue
            net = ip_network(f"{r.get_attr('RTA_DST')}/{r['dst_len']}", strict=False)
            out.append((net, names.get(r.get_attr("RTA_OIF"), "")))  # type: ignore[arg-type]
    return out


def subnet_clash(subnet: IPv4Network) -> str | None:
    """A host route (other than ashd's own sandbox links) that overlaps the sandbox subnet."""
    for net, dev in _host_routes():
        if not dev.startswith(IFNAME_PREFIX) and net.overlaps(subnet):
            return f"the route {net}" + (f" via {dev}" if dev else "")
    return None


def host_networks() -> list[IPv4Network]:
    """Networks the host's interfaces sit on (not its sandbox links, not loopback)."""
    out: list[IPv4Network] = []
    with IPRoute() as ipr:
        names = {m["index"]: m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()}
        for a in ipr.get_addr(family=2):
            if names.get(a["index"], "").startswith(IFNAME_PREFIX):
                continue
            net = ip_network(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}", strict=False)
            if not net.is_loopback and net not in out:
                out.append(net)  # type: ignore[arg-type]
    return out
