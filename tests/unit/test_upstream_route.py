"""The model API's route from the standard proxy variables (`upstream_route`)."""

from __future__ import annotations

import base64

import pytest

from ashd.errors import ConfigError
from ashd.sandboxing import upstream_route

API = "https://api.anthropic.com"


def test_no_variable_is_a_direct_route() -> None:
    route = upstream_route(API, {"PATH": "/usr/bin"})
    assert route.proxy is None and route.proxy_headers is None
    assert route.describe() == "directly"


def test_the_variable_of_the_apis_scheme_names_the_proxy() -> None:
    env = {"HTTPS_PROXY": "http://egress.corp:3128", "HTTP_PROXY": "http://plain.corp:8080"}
    assert str(upstream_route(API, env).proxy) == "http://egress.corp:3128"
    assert str(upstream_route("http://gateway.corp:8000", env).proxy) == "http://plain.corp:8080"
    assert upstream_route(API, env).describe() == "through the proxy http://egress.corp:3128 (HTTPS_PROXY)"


def test_lower_case_wins_and_all_proxy_is_the_fallback() -> None:
    assert str(upstream_route(API, {"https_proxy": "http://a:1", "HTTPS_PROXY": "http://b:2"}).proxy) == "http://a:1"
    assert str(upstream_route(API, {"ALL_PROXY": "http://c:3"}).proxy) == "http://c:3"
    assert upstream_route(API, {"HTTPS_PROXY": "  "}).proxy is None  # blank is unset


def test_a_proxy_without_a_scheme_is_http() -> None:
    assert str(upstream_route(API, {"HTTPS_PROXY": "egress.corp:3128"}).proxy) == "http://egress.corp:3128"


def test_credentials_become_a_proxy_authorization_header_and_leave_the_url() -> None:
    route = upstream_route(API, {"HTTPS_PROXY": "http://ops:p%40ss@egress.corp:3128/"})
    assert str(route.proxy) == "http://egress.corp:3128"
    assert route.proxy_headers is not None and route.request_headers == {}  # on the CONNECT only
    kind, _, token = route.proxy_headers["Proxy-Authorization"].partition(" ")
    assert (kind, base64.b64decode(token).decode()) == ("Basic", "ops:p@ss")
    assert "p@ss" not in route.describe() and "ops" not in route.describe()
    plain = upstream_route("http://gateway.corp", {"HTTP_PROXY": "http://ops:p%40ss@egress.corp:3128/"})
    assert plain.proxy_headers is None  # no tunnel: on each request, which the proxy takes off
    assert plain.request_headers == route.proxy_headers


@pytest.mark.parametrize("no_proxy", ["api.anthropic.com", ".anthropic.com", "anthropic.com", "*",
                                      "other.example, api.anthropic.com", "API.Anthropic.com.",
                                      "api.anthropic.com:443"])
def test_no_proxy_sends_the_api_directly(no_proxy: str) -> None:
    assert upstream_route(API, {"HTTPS_PROXY": "http://egress.corp:3128", "NO_PROXY": no_proxy}).proxy is None


def test_no_proxy_for_another_host_keeps_the_proxy() -> None:
    route = upstream_route(API, {"HTTPS_PROXY": "http://egress.corp:3128", "no_proxy": "internal.corp,10.0.0.0"})
    assert route.proxy is not None


@pytest.mark.parametrize("base", ["http://127.0.0.1:4999", "http://localhost:4999", "http://[::1]:4999",
                                  "http://127.8.9.10"])
def test_a_model_api_on_loopback_is_reached_directly(base: str) -> None:
    assert upstream_route(base, {"HTTP_PROXY": "http://egress.corp:3128", "ALL_PROXY": "http://x:1"}).proxy is None


@pytest.mark.parametrize("value", ["socks5://egress.corp:1080", "socks5h://u:secret@egress.corp:1080", "http://"])
def test_a_proxy_that_cannot_be_used_stops_the_start(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        upstream_route(API, {"ALL_PROXY": value})
    assert "ALL_PROXY=" in str(err.value) and "NO_PROXY" in str(err.value)
    assert "secret" not in str(err.value)


def test_a_proxy_that_is_not_a_url_stops_the_start_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as err:
        upstream_route(API, {"HTTPS_PROXY": "http://u:secret@[egress"})
    assert "HTTPS_PROXY is not a URL" in str(err.value) and "secret" not in str(err.value)


def test_no_proxy_entries_with_another_port_or_a_network_that_holds_the_address() -> None:
    env = {"HTTPS_PROXY": "http://egress.corp:3128"}
    assert upstream_route(API, {**env, "NO_PROXY": "api.anthropic.com:8443"}).proxy is not None
    assert upstream_route(API, {**env, "NO_PROXY": "thropic.com"}).proxy is not None  # not a suffix match
    gateway = "http://10.1.2.3:8000"
    plain = {"HTTP_PROXY": "http://egress.corp:3128"}
    assert upstream_route(gateway, {**plain, "NO_PROXY": "10.0.0.0/8"}).proxy is None
    assert upstream_route(gateway, {**plain, "NO_PROXY": "10.1.2.3:8000"}).proxy is None
    assert upstream_route(gateway, {**plain, "NO_PROXY": "192.168.0.0/16,10.1.2.4"}).proxy is not None
