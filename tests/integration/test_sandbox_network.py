"""Sandboxes that opt into network get their own network, not the host's (issue 9, item 3).

Every attack runs inside a real sandbox on both launch routes (tests/fixtures/netprobe.py) against
real listeners: a service of the host on all its addresses (IPv4 and IPv6), PostgreSQL (trust
auth: the attack logs in), an address only the host has, the cloud metadata address, a private
address and another sandbox. A stand-in internet (tests/fixtures/internet.py) must stay reachable.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from pyroute2 import IPRoute

from ashd.sandboxing import ExitReason, SandboxLauncher
from tests.fixtures import netprobe
from tests.fixtures.databases import PG_URL
from tests.fixtures.internet import METADATA, Internet
from tests.fixtures.sandboxes import ROUTES, program_spec, require_isolation, started_launcher, wait_for

pytestmark = pytest.mark.sandbox

PG = urlparse(PG_URL.replace("+asyncpg", ""))
PG_HOST, PG_PORT = PG.hostname or "127.0.0.1", PG.port or 5432
LISTEN_PORT = 8000


def require_network() -> None:
    require_isolation()
    missing = [tool for tool in ("nft", "nsenter") if shutil.which(tool, path="/usr/sbin:/usr/bin") is None]
    if missing:
        message = f"networked sandboxes need {', '.join(missing)} (scripts/_env.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


class HostService:
    """A host-side TCP listener on every address, IPv4 and IPv6 (like ashd on 0.0.0.0), recording
    who connected."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def service() -> Iterator[HostService]:
    svc = HostService()
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture(scope="module")
def internet() -> Iterator[Internet]:
    require_network()
    net = Internet()
    try:
        net.open()
        yield net
    finally:
        net.close()


def host_addresses() -> list[str]:
    """Every address of the host (not link-local), sandbox links included."""
    with IPRoute() as ipr:
        out = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr()]
    return [a for a in out if a and not ip_address(a).is_link_local]


def host_targets(port: int) -> dict[str, list[Any]]:
    targets: dict[str, list[Any]] = {"host loopback": ["127.0.0.1", port], "host ::1": ["::1", port],
                                     "gateway": ["gateway", port]}
    targets.update({f"host {a}": [a, port] for a in host_addresses()})
    return targets


def pg_targets() -> dict[str, list[Any]]:
    targets: dict[str, list[Any]] = {"postgres": [PG_HOST, PG_PORT], "postgres via gateway": ["gateway", PG_PORT]}
    targets.update({f"postgres at {a}": [a, PG_PORT] for a in host_addresses() if ":" not in a})
    return targets


def probe(launcher: SandboxLauncher, sandbox_id: str, cfg: dict[str, Any], *, network: bool = True) -> dict[str, Any]:
    paths = launcher.prepare(sandbox_id)
    proc = launcher.launch(program_spec(paths, sandbox_id, "netprobe.py", json.dumps(cfg), network=network))
    try:
        info = proc.wait(120)
    finally:
        proc.cleanup()
    log = (paths.logs / "sandbox.log").read_text()
    assert info.reason is ExitReason.NORMAL, log
    result: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return result


def reached(result: dict[str, Any]) -> dict[str, str]:
    return {name: r["detail"] for name, r in result["results"].items() if r["reached"]}


def refused(result: dict[str, Any]) -> dict[str, str]:
    return {name: r["detail"] for name, r in result["results"].items() if not r["reached"]}


@pytest.mark.parametrize("route", ROUTES)
def test_a_networked_sandbox_cannot_reach_the_host(tmp_path: Path, route: str, service: HostService) -> None:
    """The server's port (any host service, every address, IPv4 and IPv6) and PostgreSQL."""
    require_network()
    try:  # control: from the host, the attack on PostgreSQL works
        pg_open = bool(netprobe.pg(PG_HOST, PG_PORT))
    except OSError:
        pg_open = False
    if not pg_open and os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required under CI but not reachable at {PG_HOST}:{PG_PORT}")
    with started_launcher(tmp_path, route) as launcher:
        result = probe(launcher, "attacker", {"tcp": host_targets(service.port), "pg": pg_targets()})
    assert reached(result) == {}
    assert service.peers == []
    assert result["ipv6"] == "", "a networked sandbox has no IPv6"


@pytest.mark.parametrize("route", ROUTES)
def test_a_networked_sandbox_reaches_the_internet_and_nothing_private(
    tmp_path: Path, route: str, internet: Internet, service: HostService
) -> None:
    from ashd.sandboxing._egress_policy import EgressPolicy

    policy = EgressPolicy(subnet=internet.sandbox_subnet, dns=(internet.private_ip,))
    with started_launcher(tmp_path, route, egress=policy) as launcher:
        other = launcher.prepare("other")
        listener = launcher.launch(program_spec(other, "other", "netprobe.py", json.dumps({"listen": LISTEN_PORT}),
                                                network=True))
        try:
            log = other.logs / "sandbox.log"
            wait_for(lambda: log.exists() and b"listening" in log.read_bytes(), 60, "the other sandbox to listen")
            other_link = launcher.network_link("other")
            assert other_link is not None
            private, public = str(internet.private_ip), str(internet.public_ip)
            result = probe(launcher, "attacker", {
                "http": {"internet": [public, 80], "internet 8080": [public, 8080],
                         "metadata": [METADATA, 80], "private": [private, 8080]},
                "tcp": {"dns resolver": [private, 53], "other sandbox": [str(other_link.sandbox_ip), LISTEN_PORT],
                        "other sandbox's gateway": [str(other_link.host_ip), service.port],
                        "host-only address": [str(internet.host_only_ip), service.port],
                        "host side of the internet link": [str(internet.host_ip), service.port],
                        "host loopback": ["127.0.0.1", service.port]},
                "pg": {"postgres": [PG_HOST, PG_PORT]},
            })
            assert listener.poll() is None, log.read_text()
            assert "accepted" not in log.read_text()
        finally:
            listener.kill()
            listener.cleanup()
    assert reached(result) == {"internet": f"internet {public}:80", "internet 8080": f"internet {public}:8080",
                               "dns resolver": f"connected to {private}:53"}, refused(result)
    assert service.peers == []
    assert result["resolv"].splitlines()[0] == f"nameserver {private}"
    assert result["ipv6"] == ""
    assert [r.split()[1] for r in result["routes"]] == ["00000000", result["routes"][1].split()[1]]


@pytest.mark.parametrize("route", ROUTES)
def test_the_operator_allowlist_opens_exactly_what_it_names(tmp_path: Path, route: str, internet: Internet,
                                                             service: HostService) -> None:
    from ashd.sandboxing._egress_policy import EgressPolicy

    policy = EgressPolicy.parse(subnet=str(internet.sandbox_subnet), dns="",
                                allow=f"{METADATA}, {internet.private_ip}:8080, {internet.host_only_ip}",
                                public=False)
    private = str(internet.private_ip)
    with started_launcher(tmp_path, route, egress=policy) as launcher:
        result = probe(launcher, "allowed", {
            "http": {"metadata": [METADATA, 80], "private 8080": [private, 8080], "private 9090": [private, 9090],
                     "internet": [str(internet.public_ip), 80]},
            # Even allowlisted, an address of the host itself stays closed.
            "tcp": {"host-only address": [str(internet.host_only_ip), service.port],
                    "dns": [private, 53]},
        })
    assert reached(result) == {"metadata": f"internet {METADATA}:80", "private 8080": f"internet {private}:8080"}
    assert service.peers == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_sandbox_without_network_has_none(tmp_path: Path, route: str, internet: Internet) -> None:
    from ashd.sandboxing._egress_policy import EgressPolicy

    policy = EgressPolicy(subnet=internet.sandbox_subnet, dns=(internet.private_ip,))
    with started_launcher(tmp_path, route, egress=policy) as launcher:
        result = probe(launcher, "offline", {"http": {"internet": [str(internet.public_ip), 80]},
                                             "tcp": {"dns resolver": [str(internet.private_ip), 53]}},
                       network=False)
        assert launcher.network_link("offline") is None
    assert reached(result) == {}
    assert result["routes"] == []


def _ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def _links(prefix: str) -> list[str]:
    with IPRoute() as ipr:
        names = [m.get_attr("IFLA_IFNAME") or "" for m in ipr.get_links()]
    return [n for n in names if n.startswith(prefix)]


def _tables() -> list[str]:
    from ashd.sandboxing import _nft

    return _nft.tables()


@pytest.mark.parametrize("route", ROUTES)
def test_network_objects_go_with_the_sandbox_and_the_server(tmp_path: Path, route: str) -> None:
    require_network()
    forward_before = _ip_forward()
    with started_launcher(tmp_path, route) as launcher:
        net = launcher._network
        assert net is not None
        paths = launcher.prepare("short-lived")
        proc = launcher.launch(program_spec(paths, "short-lived", "netprobe.py", json.dumps({"listen": LISTEN_PORT}),
                                            network=True))
        link = launcher.network_link("short-lived")
        assert link is not None
        assert launcher.isolation.network.startswith("own namespace, NAT and egress firewall")
        assert Path(link.netns_path).exists() and _links(link.ifname) == [link.ifname]
        assert net.table in _tables() and _ip_forward() == "1"
        proc.kill()
        proc.wait(30)
        proc.cleanup()
        assert launcher.network_link("short-lived") is None
        assert not Path(link.netns_path).exists() and _links(link.ifname) == []
        with IPRoute() as ipr:
            routes = [(r.get_attr("RTA_DST"), r["dst_len"]) for r in ipr.get_routes(family=2, table=254)]
        assert (str(link.host_ip), 31) not in routes, "the slot's claim goes with the veth"
    assert net.table not in _tables()
    assert _links(net.ifprefix) == []
    if forward_before == "0" and not any(t.startswith("ashd_") and t != "ashd_forward_guard" for t in _tables()):
        assert _ip_forward() == "0", "IPv4 forwarding is switched back off with the last ashd table"


def test_a_restarted_server_sweeps_what_a_killed_one_left(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    require_network()
    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-m", "tests.fixtures.launcher_parent", str(tmp_path), "zygote",
                               "network"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        state = json.loads(parent.stdout.readline())
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for pipe in (parent.stdin, parent.stdout):
            if pipe is not None:
                pipe.close()
    try:  # the dead server's lock is held by its holder: no other server's start sweeps this meanwhile
        assert state["netns"] and all(Path(p).exists() for p in state["netns"])
        assert all(_links(name) for name in state["ifnames"]) and state["table"] in _tables()
        from ashd.sandboxing._network import _try_liveness_lock

        assert _try_liveness_lock(state["table"].removeprefix("ashd_")) is None, "the holder keeps it live"
    finally:
        os.kill(state["lock_holder"], signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{state['lock_holder']}").exists() or
             Path(f"/proc/{state['lock_holder']}/stat").read_text().split(") ")[1].startswith("Z"),
             what="the lock holder to die")
    with started_launcher(tmp_path, "bwrap"):
        assert not any(Path(p).exists() for p in state["netns"])
        assert not any(_links(name) for name in state["ifnames"])
        assert state["table"] not in _tables()


def test_addresses_are_claimed_host_wide(tmp_path: Path) -> None:
    """Two servers sharing one subnet (two checkouts on a host) never hand out the same /31."""
    require_network()
    from ashd.sandboxing._egress_policy import EgressPolicy

    # A /30 of the test's own (two concurrent test runs must not compete for the same two slots).
    base = ip_address("10.215.0.0") + 4 * (os.getpid() % 16384)
    policy = EgressPolicy.parse(subnet=f"{base}/30")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with started_launcher(tmp_path / "a", "zygote", egress=policy) as a, \
            started_launcher(tmp_path / "b", "zygote", egress=policy) as b:
        pa, pb = a.prepare("one"), b.prepare("two")
        spec = {"listen": LISTEN_PORT}
        procs = [a.launch(program_spec(pa, "one", "netprobe.py", json.dumps(spec), network=True)),
                 b.launch(program_spec(pb, "two", "netprobe.py", json.dumps(spec), network=True))]
        la, lb = a.network_link("one"), b.network_link("two")
        assert la is not None and lb is not None
        assert {la.slot, lb.slot} == {0, 1}  # a /30 holds two sandboxes
        pc = a.prepare("three")
        from ashd.errors import SandboxError

        with pytest.raises(SandboxError, match="no free sandbox network slot"):
            a.launch(program_spec(pc, "three", "netprobe.py", json.dumps(spec), network=True))
        for proc in procs:
            proc.kill()
            proc.cleanup()


def test_a_subnet_the_host_uses_is_refused_with_a_reason(tmp_path: Path, internet: Internet) -> None:
    """The test internet's link is 172.31.x.y/31 on the host: a sandbox subnet over it would shadow it."""
    from ashd.errors import SandboxError
    from ashd.sandboxing._egress_policy import EgressPolicy

    with started_launcher(tmp_path, "zygote", egress=EgressPolicy.parse(subnet="172.31.0.0/16")) as launcher:
        assert "SERVICE_SANDBOX_NETWORK_SUBNET=172.31.0.0/16 overlaps" in launcher.isolation.network
        paths = launcher.prepare("clash")
        with pytest.raises(SandboxError, match="asks for network, but SERVICE_SANDBOX_NETWORK_SUBNET"):
            launcher.launch(program_spec(paths, "clash", "netprobe.py", "{}", network=True))
        assert launcher.network_link("clash") is None
        # Sandboxes without network are not affected.
        result = probe(launcher, "offline", {}, network=False)
        assert result["routes"] == []
