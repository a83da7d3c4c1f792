"""How the model proxy reaches the model API: directly, or through the operator's HTTP proxy.

Hosts that reach the internet only through an egress proxy name it in the variables every HTTP
client reads (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, in either case; the lower-case
one wins, as in curl and Python's `urllib`). The Anthropic SDK and Claude Code honour them, so an
operator expects the server's model calls to as well. They are read once, at start: aiohttp's own
`trust_env` reads them on each request in a worker thread, a thread trip on the path of every model
call.

A model API on this host's loopback (a local gateway, the fake model) is always reached directly, as
Go's HTTP client does: a proxy elsewhere could not reach it.

Sandboxes never see these variables (their environment is an allow-list): their one way to the model
is the proxy's socket.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

from ashd.errors import ConfigError

_PORTS = {"https": 443, "http": 80}


@dataclass(frozen=True)
class UpstreamRoute:
    """`proxy`: the proxy's URL without its credentials, or None to connect directly. The
    `Proxy-Authorization` made from the credentials the URL carried goes on the tunnel's CONNECT to an
    https API (`proxy_headers`), and on each request itself to an http one (`request_headers`: the
    proxy takes it off; aiohttp puts `proxy_headers` on a CONNECT only)."""

    proxy: URL | None = None
    proxy_headers: Mapping[str, str] | None = None
    request_headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    variable: str | None = None  # the variable that named the proxy, for the start-up line

    def describe(self) -> str:
        if self.proxy is None:
            return "directly"
        return f"through the proxy {self.proxy} ({self.variable})"


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """The value of `name` in lower case, else in upper case, with the name found; blank is unset."""
    for key in (name.lower(), name.upper()):
        value = environ.get(key, "").strip()
        if value:
            return key, value
    return None


def upstream_route(base_url: str, environ: Mapping[str, str]) -> UpstreamRoute:
    """The route to `base_url` that `environ` asks for. A proxy that cannot be used is a ConfigError
    at start rather than model calls that quietly go around it."""
    target = urllib.parse.urlsplit(base_url)
    scheme = target.scheme.lower()
    found = _variable(environ, f"{scheme}_proxy") or _variable(environ, "all_proxy")
    if found is None:
        return UpstreamRoute()
    if _loopback(target.hostname or ""):
        return UpstreamRoute()
    bypass = _variable(environ, "no_proxy")
    if bypass is not None and _bypassed(target.hostname or "", target.port or _PORTS.get(scheme), bypass[1]):
        return UpstreamRoute()
    name, raw = found
    try:
        url = URL(raw if "://" in raw else f"http://{raw}")  # `proxy:3128`, as curl and urllib read it
    except ValueError:
        raise ConfigError(f"{name} is not a URL: give the model API's proxy as http://host:port") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{name}={_hidden(url)}: the model API's proxy must be an http:// or https:// URL "
                          "with a host (socks proxies are not supported); unset it, or list the model API's "
                          "host in NO_PROXY, to connect directly")
    auth = {"Proxy-Authorization": aiohttp.encode_basic_auth(url.user, url.password or "")} if url.user else {}
    bare = url.with_user(None).with_path("").with_query(None).with_fragment(None)
    if scheme == "https":
        return UpstreamRoute(bare, auth or None, variable=name)
    return UpstreamRoute(bare, None, auth, variable=name)


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether NO_PROXY lists `host`, as curl reads it: `*`; a name, which covers its subdomains
    (a leading dot is the same); an address or a network (`10.0.0.0/8`); any of them with `:port`."""
    host = host.lower().rstrip(".")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and (not entry_port.isdigit() or port != int(entry_port)):
            continue
        name = name.strip("[]").lstrip(".").rstrip(".")
        if not name:
            continue
        if host == name or host.endswith("." + name):
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(name, strict=False):
                return True
        except ValueError:
            pass
    return False


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hidden(url: URL) -> str:
    return str(url.with_password("***") if url.password else url)
