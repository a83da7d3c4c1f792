"""One networked sandbox's plumbing: a named network namespace and a veth pair into it.

    host netns                                   sandbox netns /run/netns/ashd-<key>-<sandbox id>
    ashv<key><slot>  <host ip>/31  ◄──── veth ────►  eth0  <sandbox ip>/31, default via <host ip>
      route <slot /31> dev ashv… (the claim)          lo up; IPv6 disabled

The netns is created by a short-lived thread that unshares CLONE_NEWNET (network namespaces are
per thread), bind-mounts it under /run/netns and opens a netlink socket in it; that thread exits,
so no thread of the server ever lingers in a sandbox's namespace. Links, addresses and routes are
then set through pyroute2 on two netlink sockets, one per namespace.

A slot's /31 is claimed host-wide by adding its route with NLM_F_EXCL: two servers on one host (or
two test runs) that share a subnet cannot hand out the same addresses, and the claim disappears
with the veth.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import threading
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from pyroute2 import Conntrack, IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

from ashd.sandboxing._egress_policy import EgressPolicy

NETNS_DIR = Path("/run/netns")
SANDBOX_IFNAME = "eth0"
IFA_F_NOPREFIXROUTE = 0x200
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_dir_lock = threading.Lock()


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass(frozen=True)
class SandboxLink:
    netns: str  # name under /run/netns
    ifname: str  # host side of the veth
    slot: int
    host_ip: IPv4Address
    sandbox_ip: IPv4Address

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)


def _ensure_netns_dir() -> None:
    """/run/netns as a shared mount point, as `ip netns add` makes it: a namespace removed here is
    unmounted from every mount namespace that copied it."""
    with _dir_lock:
        NETNS_DIR.mkdir(mode=0o755, exist_ok=True)
        target = str(NETNS_DIR).encode()
        if _libc.mount(b"none", target, None, MS_SHARED | MS_REC, None) == 0:
            return
        _check(_libc.mount(target, target, None, MS_BIND | MS_REC, None), "bind /run/netns")
        _check(_libc.mount(b"none", target, None, MS_SHARED | MS_REC, None), "share /run/netns")


def _unshare_into(name: str) -> socket.socket:
    """Runs in a throwaway thread: new netns, bound to its name, IPv6 off, a netlink socket in it."""
    path = str(NETNS_DIR / name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    _check(_libc.mount(b"/proc/thread-self/ns/net", path.encode(), None, MS_BIND, None), f"bind {path}")
    # Before eth0 exists, so it inherits "default": no link-local fe80:: address, no IPv6 at all.
    for conf in ("all", "default"):
        _write(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "1")
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)  # NETLINK_ROUTE, in the new netns


def create_netns(name: str) -> socket.socket:
    """Create /run/netns/<name>; returns a NETLINK_ROUTE socket that lives inside it."""
    _ensure_netns_dir()
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["sock"] = _unshare_into(name)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller's thread)
            result["error"] = exc

    worker = threading.Thread(target=run, name="ashd-netns-create")
    worker.start()
    worker.join()
    if "error" in result:
        delete_netns(name)
        raise result["error"]  # type: ignore[misc]
    sock = result["sock"]
    assert isinstance(sock, socket.socket)
    return sock


def delete_netns(name: str) -> None:
    path = NETNS_DIR / name
    _libc.umount2(str(path).encode(), MNT_DETACH)  # fails harmlessly when it is not mounted
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def list_netns(prefix: str) -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return []


def ifname_for(prefix: str, slot: int) -> str:
    return f"{prefix}{slot:04x}"


def _host_sysctls(ifname: str) -> None:
    _write(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "1")
    _write(f"/proc/sys/net/ipv4/conf/{ifname}/rp_filter", "1")  # strict: no spoofed sources
    _write(f"/proc/sys/net/ipv4/conf/{ifname}/send_redirects", "0")


def plumb(netns: str, ns_sock: socket.socket, ifprefix: str, policy: EgressPolicy, slots: list[int]) -> SandboxLink:
    """Create the veth pair and claim the first free slot of `slots` (in order). Raises OSError
    when every slot is taken."""
    with IPRoute() as host, IPRoute(use_socket=ns_sock) as ns:
        host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            ifname, h, slot = _create_veth(host, ns, host_fd, ifprefix, slots)
        finally:
            os.close(host_fd)
        try:
            slot = _claim(host, h, ifprefix, policy, slots, slot)
            ifname = ifname_for(ifprefix, slot)
            host_ip, sandbox_ip = policy.addresses(slot)
            host.addr("add", index=h, address=str(host_ip), prefixlen=31, flags=IFA_F_NOPREFIXROUTE)
            lo = ns.link_lookup(ifname="lo")[0]
            eth = ns.link_lookup(ifname=SANDBOX_IFNAME)[0]
            ns.link("set", index=lo, state="up")
            ns.addr("add", index=eth, address=str(sandbox_ip), prefixlen=31)
            ns.link("set", index=eth, state="up")
            ns.route("add", dst="0.0.0.0/0", gateway=str(host_ip))
        except BaseException:
            with contextlib.suppress(NetlinkError):
                host.link("del", index=h)
            raise
    # No conntrack flush here (it walks the whole table, ~20 ms): every way an address is given up
    # (unplumb, and the start-up sweep of a dead server's links) flushes it.
    return SandboxLink(netns, ifname, slot, host_ip, sandbox_ip)


def _create_veth(host: IPRoute, ns: IPRoute, host_fd: int, ifprefix: str, slots: list[int]) -> tuple[str, int, int]:
    for slot in slots:
        ifname = ifname_for(ifprefix, slot)
        try:
            ns.link("add", ifname=SANDBOX_IFNAME, kind="veth", peer={"ifname": ifname, "net_ns_fd": host_fd})
        except NetlinkError as exc:
            if exc.code == errno.EEXIST:
                continue  # that name is in use on the host: a live sandbox of ours
            raise
        h = host.link_lookup(ifname=ifname)[0]
        _host_sysctls(ifname)
        host.link("set", index=h, state="up")
        return ifname, h, slot
    raise OSError(errno.EADDRNOTAVAIL, "no free sandbox network slot")


def _claim(host: IPRoute, h: int, ifprefix: str, policy: EgressPolicy, slots: list[int], slot: int) -> int:
    """Add the slot's /31 route with NLM_F_EXCL; on EEXIST (another server holds it) rename the
    veth to the next slot and try again."""
    rest = slots[slots.index(slot):]
    for i, candidate in enumerate(rest):
        if i:
            host.link("set", index=h, state="down")
            try:
                host.link("set", index=h, ifname=ifname_for(ifprefix, candidate))
            except NetlinkError as exc:
                if exc.code == errno.EEXIST:
                    continue
                raise
            host.link("set", index=h, state="up")
        net = f"{policy.addresses(candidate)[0]}/31"
        try:
            host.route("add", dst=net, oif=h)
            return candidate
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise
    raise OSError(errno.EADDRNOTAVAIL, "no free sandbox network slot: every /31 of the subnet is in use")


def unplumb(link: SandboxLink) -> None:
    """Remove the veth (both ends, and with it the slot's route), the netns and tracked flows."""
    with IPRoute() as host:
        for index in host.link_lookup(ifname=link.ifname):
            with contextlib.suppress(NetlinkError):
                host.link("del", index=index)
    delete_netns(link.netns)
    flush_conntrack(link.sandbox_ip)


def delete_links(prefix: str) -> int:
    """Delete every host link whose name starts with `prefix` (leftovers of a dead server), and
    forget the flows of the sandbox address behind each."""
    removed = 0
    with IPRoute() as host:
        for msg in host.get_links():
            name = msg.get_attr("IFLA_IFNAME") or ""
            if not name.startswith(prefix):
                continue
            peers = [IPv4Address(a.get_attr("IFA_ADDRESS")) + 1 for a in host.get_addr(family=socket.AF_INET,
                                                                                    index=msg["index"])]
            with contextlib.suppress(NetlinkError):
                host.link("del", index=msg["index"])
                removed += 1
            for address in peers:
                flush_conntrack(address)
    return removed


def flush_conntrack(address: IPv4Address) -> None:
    """Forget every tracked flow the address started: a reused address must not inherit replies
    (the forward rules let established flows into a sandbox) or count against the next holder's
    connection limit."""
    with Conntrack() as ct:
        for entry in list(ct.dump_entries(tuple_orig=NFCTAttrTuple(saddr=str(address)))):
            with contextlib.suppress(NetlinkError):
                ct.entry("del", tuple_orig=entry.tuple_orig)
