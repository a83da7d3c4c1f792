"""Path deploys are not a window on the host: attacks through real HTTP (and real sandboxes for the
copy into a session), for the operator's tenant `default` and for other tenants."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401

SECRET = "host-secret-4711"


def agent_dir(path: Path, prompt: str = "You are a test agent.") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "AGENT.md").write_text(prompt)
    return path


def data_path(api: Api) -> Path:
    assert api.server.components is not None
    return api.server.components.settings.data_path


@pytest.fixture
def shm_agent() -> Iterator[Path]:
    """An agent folder in /dev/shm, which any local user can write."""
    path = Path("/dev/shm") / f"ashd-test-{uuid.uuid4().hex[:8]}"
    agent_dir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_proc_sys_dev_and_the_data_dir_are_refused_without_disclosure(
    api: Api, tmp_path: Path, shm_agent: Path,
) -> None:
    data = data_path(api)
    agent_dir(data / "agents" / "other-tenant" / "bot" / "v1")  # another tenant's managed agent
    links = tmp_path / "links"
    links.mkdir()
    for name, target in [("to-cwd", "/proc/self/cwd"), ("to-pid1", "/proc/1/root"), ("to-root", "/proc/self/root"),
                         ("to-data", str(data)), ("to-managed", str(data / "agents" / "other-tenant" / "bot" / "v1")),
                         ("to-shm", str(shm_agent))]:
        os.symlink(target, links / name)
    attacks = ["/proc/1/root", "/proc/1/cwd", "/proc/self/cwd", "/proc/self/root", "/proc/self/root/etc",
               "/proc", "/sys", "/sys/kernel", "/dev", "/dev/shm", str(shm_agent), "/dev/null",
               str(data), ".", "agents", "agents/other-tenant/bot/v1", "sandboxes", "snapshots", "../",
               str(data.parent), "/", *[str(p) for p in sorted(links.iterdir())]]
    host_facts = {os.getcwd(), str(data), str(Path("/proc/self/cwd").resolve())}
    for raw in attacks:
        status, body = await api.call("POST", "/api/agents", json={"name": "probe", "path": raw})
        assert status == 400, (raw, body)  # never 201, never a 500
        assert body["statusCode"] == 400
        shown = body["error"].replace(repr(raw), "")  # the caller's own path may be repeated, nothing else
        for fact in host_facts:
            assert fact not in shown, (raw, body)
    status, body = await api.call("GET", "/api/agents")
    assert body == {"agents": []}


async def test_library_and_ordinary_folders_stay_deployable_by_default(api: Api, tmp_path: Path) -> None:
    agent_dir(data_path(api) / "library" / "shared-bot")
    status, body = await api.call("POST", "/api/agents", json={"name": "lib", "path": "library/shared-bot"})
    assert status == 201, body
    folder = agent_dir(tmp_path / "plain")
    status, body = await api.call("POST", "/api/agents", json={"name": "plain", "path": str(folder)})
    assert status == 201, body


async def test_other_tenants_deploy_only_from_their_own_folders(aiohttp_client: Any, settings: Settings,
                                                                 tmp_path: Path) -> None:
    root = tmp_path / "roots"
    mine = agent_dir(root / "acme" / "bot")
    theirs = agent_dir(root / "globex" / "bot")
    (theirs / "credentials.txt").write_text(SECRET)
    os.symlink(theirs, root / "acme" / "borrowed")  # a link in acme's folder to globex's agent
    host = agent_dir(tmp_path / "host-folder")
    server, api = await start_api(aiohttp_client, settings.with_(agent_roots=str(root)))
    try:
        library = agent_dir(data_path(api) / "library" / "acme" / "lib-bot")
        acme = await api.new_tenant_key("acme")
        for raw in (str(mine), str(library), "library/acme/lib-bot"):
            status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "ok", "path": raw})
            assert status == 201, (raw, body)
        refused = [str(theirs), str(root / "acme" / "borrowed"), str(host), str(root), str(root / "acme" / ".."),
                   "library/globex", "/etc", "/nonexistent/dir", "/root", "~"]
        answers = set()
        for raw in refused:
            status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "no", "path": raw})
            assert status == 400, (raw, body)
            answers.add(body["error"].replace(repr(raw), "<path>"))
        # one answer for everything outside the tenant's folder: existence on the host is not revealed
        assert len(answers) == 1, answers
        assert "acme" in answers.pop()
        # the operator's tenant may use any folder under the roots
        status, body = await api.call("POST", "/api/agents", json={"name": "ops", "path": str(theirs)})
        assert status == 201, body
        status, body = await api.call("GET", "/api/agents/ok/files/credentials.txt", key=acme)
        assert status == 404
    finally:
        await api.client.close()
        await server.stop()


async def test_a_deploy_the_policy_no_longer_allows_is_refused_at_use(aiohttp_client: Any, settings: Settings,
                                                                      tmp_path: Path) -> None:
    root = tmp_path / "roots"
    agent_dir(root / "acme" / "bot")
    server, api = await start_api(aiohttp_client, settings.with_(agent_roots=str(root)))
    try:
        acme = await api.new_tenant_key("acme")
        status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "bot", "path": str(root / "acme" / "bot")})
        assert status == 201, body
    finally:
        await api.client.close()
        await server.stop()
    # The operator drops SERVICE_AGENT_ROOTS: acme's registered folder is no longer one it may use.
    server, api = await start_api(aiohttp_client, settings)
    try:
        for path in ("/api/agents/bot/files", "/api/agents/bot/files/AGENT.md"):
            status, body = await api.call("GET", path, key=acme)
            assert status == 400 and "redeploy" in body["error"], body
        status, body = await api.call("POST", "/api/sessions", key=acme, json={"agent": "bot"})
        assert status == 400 and "redeploy" in body["error"], body
    finally:
        await api.client.close()
        await server.stop()


async def test_without_roots_other_tenants_use_only_the_library(api: Api, tmp_path: Path) -> None:
    host = agent_dir(tmp_path / "anything")
    acme = await api.new_tenant_key("acme")
    status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "x", "path": str(host)})
    assert status == 400 and "not allowed for this tenant" in body["error"], body
    agent_dir(data_path(api) / "library" / "acme" / "bot")
    status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "x", "path": "library/acme/bot"})
    assert status == 201, body


async def test_health_and_start_warn_when_tenants_share_an_unconfined_server(
        aiohttp_client: Any, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def logged_at_start() -> list[str]:
        return [r.getMessage() for r in caplog.records if "SERVICE_AGENT_ROOTS" in r.getMessage()]

    server, api = await start_api(aiohttp_client, settings)
    try:
        status, body = await api.call("GET", "/health")
        assert status == 200 and body["warnings"] == []  # one tenant: nothing to warn about
        assert logged_at_start() == []
        await api.new_tenant_key("acme")
        status, body = await api.call("GET", "/health")
        assert len(body["warnings"]) == 1 and "SERVICE_AGENT_ROOTS" in body["warnings"][0]
    finally:
        await api.client.close()
        await server.stop()
    caplog.clear()
    server, api = await start_api(aiohttp_client, settings)  # the same data: the start says it too
    try:
        status, body = await api.call("GET", "/health")
        assert logged_at_start() == body["warnings"] and len(body["warnings"]) == 1
    finally:
        await api.client.close()
        await server.stop()
    caplog.clear()
    server, api = await start_api(aiohttp_client, settings.with_(agent_roots=str(tmp_path)))
    try:
        status, body = await api.call("GET", "/health")
        assert body["warnings"] == [] and logged_at_start() == []  # confined: no warning
    finally:
        await api.client.close()
        await server.stop()


@pytest.fixture
async def sbox_api(aiohttp_client: Any, settings: Settings, fake_model: FakeModel, tmp_path: Path) -> Any:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test", agent_roots=str(tmp_path)))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


@pytest.mark.sandbox
async def test_folder_swapped_for_a_link_after_deploy_is_never_followed(sbox_api: Api, tmp_path: Path) -> None:
    api = sbox_api
    folder = agent_dir(tmp_path / "acme" / "bot")
    os.mkfifo(folder / "pipe")  # a FIFO must neither block nor break the copy
    secret_dir = agent_dir(tmp_path / "private")
    (secret_dir / "credentials.txt").write_text(SECRET)
    acme = await api.new_tenant_key("acme")
    status, body = await api.call("POST", "/api/agents", key=acme, json={"name": "bot", "path": str(folder)})
    assert status == 201, body
    status, body = await api.call("POST", "/api/sessions", key=acme, json={"agent": "bot"})
    assert status == 201, body
    sid = body["session"]["id"]
    status, body = await api.call("GET", f"/api/sessions/{sid}/files", key=acme)
    assert {f["path"] for f in body["files"]} == {"AGENT.md"}

    # The tenant (or anyone who can write there) swaps its folder for a link to a private folder.
    shutil.rmtree(folder)
    os.symlink(secret_dir, folder)
    status, body = await api.call("GET", "/api/agents/bot/files", key=acme)
    assert status == 404 and SECRET not in str(body), body
    status, body = await api.call("GET", "/api/agents/bot/files/credentials.txt", key=acme)
    assert status == 404 and SECRET not in str(body), body
    status, body = await api.call("POST", "/api/sessions", key=acme, json={"agent": "bot"})
    assert status == 500 and "redeploy" in body["error"] and str(tmp_path) not in body["error"], body
    # A link one level up is refused the same way.
    os.unlink(folder)
    (tmp_path / "acme").rename(tmp_path / "acme-old")
    os.symlink(tmp_path / "private-parent", tmp_path / "acme")
    agent_dir(tmp_path / "private-parent" / "bot")
    (tmp_path / "private-parent" / "bot" / "credentials.txt").write_text(SECRET)
    status, body = await api.call("GET", "/api/agents/bot/files", key=acme)
    assert status == 404 and SECRET not in str(body), body
    status, body = await api.call("POST", "/api/sessions", key=acme, json={"agent": "bot"})
    assert status == 500 and "redeploy" in body["error"], body
