"""Shared fixtures: databases (SQLite and PostgreSQL), a running ashd with a real HTTP client."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from aiohttp.test_utils import TestClient

from ashd.app import Server
from ashd.config import Settings
from tests.fixtures.databases import fresh_postgres

pytest_plugins = [
    "tests.fixtures.fake_model_fixture",
    "tests.fixtures.bridge_fixture",
    "tests.fixtures.s3_fixture",
]


def _ashd_dir() -> Path:
    import ashd

    return Path(ashd.__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """scripts/test_installed sets ASHD_TEST_INSTALLED: then the suite must test that installation."""
    installed = os.environ.get("ASHD_TEST_INSTALLED")
    if installed and not _ashd_dir().is_relative_to(Path(installed).resolve()):
        raise pytest.UsageError(f"ASHD_TEST_INSTALLED={installed}, but ashd is imported from {_ashd_dir()}")
    _server_wakeup_once()
    # Every engine run by the suite in a process of its own (the bridge fixture) checks each request's
    # kept message JSON against a fresh encoding (ashd/bridge/engine/_message_json.py).
    os.environ.setdefault("ASHD_VERIFY_REQUEST_JSON", "1")


def _server_wakeup_once() -> None:
    """CPython 3.13.0's asyncio.Server wakes its closers a second time, and fails (a TypeError that
    pytest reports from a transport's `__del__`), when it is closed after accepting a connection it
    has not handled yet: python/cpython#109564, fixed in 3.13.1 by the same check as here. In the
    tests the model proxy serves on the test's asyncio loop, and a sandbox's proxy is closed while
    the bridge's next connection, opened ahead, may be just accepted. (ashd serves on uvloop.)"""
    import asyncio.base_events
    import sys

    if sys.version_info[:3] != (3, 13, 0):
        return
    server: Any = asyncio.base_events.Server  # _wakeup and _waiters are private: not in the stubs
    wakeup = server._wakeup

    def _wakeup(self: Any) -> None:
        if self._waiters is not None:
            wakeup(self)

    server._wakeup = _wakeup


def pytest_report_header() -> str:
    import sys

    return f"ashd from {_ashd_dir()}; Python {sys.version.split()[0]} ({sys.executable})"


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}"
        return
    async for url in fresh_postgres():
        yield url


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: sandbox socket paths must fit the 108-byte Unix socket limit."""
    path = Path(tempfile.mkdtemp(prefix="ashd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def settings(short_tmp: Path, db_url: str) -> Settings:
    return Settings(
        data_dir=str(short_tmp / "data"),
        database_url=db_url,
        prewarm=0,
        zygote=False,
        anthropic_base_url=None,
        rate_limit_rps=1000.0,
        rate_limit_burst=1000,
        actor_timeout_seconds=30.0,
    )


class Api:
    """A real HTTP client on a running ashd, authenticated as tenant `default`."""

    def __init__(self, client: TestClient[Any, Any], server: Server, key: str) -> None:
        self.client = client
        self.server = server
        self.key = key

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def call(self, method: str, path: str, *, key: str | None = None, **kw: Any) -> tuple[int, Any]:
        headers = {**self.headers(key), **kw.pop("headers", {})}
        resp = await self.client.request(method, path, headers=headers, **kw)
        text = await resp.text()
        try:
            import json

            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    async def new_tenant_key(self, tenant: str) -> str:
        services = self.server.components
        assert services is not None
        _, key = await services.api_keys.mint(tenant, "test", source="operator")
        return key


async def start_api(aiohttp_client: Any, settings: Settings) -> tuple[Server, Api]:
    server = Server(settings)
    await server.start_components()
    assert server.app is not None
    client = await aiohttp_client(server.app)
    key_file = Path(settings.data_dir) / "initial-api-key"
    key = settings.api_key or key_file.read_text().strip()
    return server, Api(client, server, key)


@pytest.fixture
async def api(aiohttp_client: Any, settings: Settings) -> AsyncIterator[Api]:
    server, api = await start_api(aiohttp_client, settings)
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


@pytest.fixture(autouse=True)
def _stop_actors() -> Any:
    yield
    pykka.ActorRegistry.stop_all(timeout=10)


def _mount_points() -> list[Path]:
    with open("/proc/self/mounts") as f:
        # Fields are space-separated with octal escapes (`\040` for a space) in paths.
        return [Path(line.split()[1].encode().decode("unicode_escape")) for line in f]


@pytest.fixture(autouse=True)
def _no_mount_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests that kill a server leave its sandboxes' disks mounted, as a crash does (the next start
    rescues them). Once a test is over nothing may stay mounted under its own temp dirs: pytest's
    removal of old temp dirs in a later run would fail on them (and only this test's own dirs, as
    other test runs on the host have theirs)."""
    yield
    roots = [p for name in ("tmp_path", "short_tmp") if isinstance(p := request.node.funcargs.get(name), Path)]
    if not roots:
        return
    from ashd.sandboxing._disk import unmount

    for point in sorted(_mount_points(), key=lambda m: len(m.parts), reverse=True):
        if any(point.is_relative_to(root) for root in roots):
            unmount(point)
    for root in roots:
        if root.name.startswith("ashd-"):  # short_tmp's, removed before this ran
            shutil.rmtree(root, ignore_errors=True)
