# ruff: noqa: F811  (fixtures are imported by name)
"""The operator's per-agent loosening (SERVICE_SANDBOX_PTRACE_AGENTS) through the real server:
/health says which profile is in force, only the named tenant's agent can ptrace, every other
sandbox keeps the default filter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import deploy

pytestmark = pytest.mark.sandbox

# Forks a child and tries to seize it; prints the errno (0: traced) and the filter mode.
PROBE = (
    "grep Seccomp: /proc/self/status; python -I -c \"import ctypes, os, signal\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "pid = os.fork()\n"
    "if pid == 0:\n    signal.pause()\n"
    "r = libc.ptrace(0x4206, pid, None, None)\n"
    "print('ptrace-errno', 0 if r == 0 else ctypes.get_errno())\n"
    "os.kill(pid, 9)\""
)


@pytest.fixture
async def papi(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> AsyncIterator[Api]:
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, prewarm=1, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test",
        sandbox_ptrace_agents=("default/tracer",)))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def _probe(api: Api, fake_model: FakeModel, agent: str, token: str, key: str | None = None) -> str:
    fake_model.script(token, [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": PROBE}}]},
        {"content": [{"type": "text", "text": "done"}]},
    ])
    status, body = await api.call("POST", "/api/sessions", json={"agent": agent}, key=key)
    assert status == 201, body
    sid = body["session"]["id"]
    headers = api.headers(key)
    resp = await api.client.post(f"/api/sessions/{sid}/messages", json={"content": token}, headers=headers)
    assert resp.status == 200
    await resp.text()
    status, events = await api.call("GET", f"/api/sessions/{sid}/events?type=tool_result", key=key)
    assert status == 200 and events["events"], events
    data = events["events"][0]["data"]
    content = (json.loads(data) if isinstance(data, str) else data)["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


async def test_health_names_the_profile_in_force(papi: Api) -> None:
    body = await (await papi.client.get("/health")).json()
    iso = body["isolation"]
    assert iso["seccomp"] == "default"
    assert iso["seccompPtraceAgents"] == 1
    assert iso["sandboxUserNamespaces"] is False


async def test_only_the_named_tenants_agent_may_ptrace(papi: Api, fake_model: FakeModel) -> None:
    await deploy(papi, "tracer")
    await deploy(papi, "plain")
    traced = await _probe(papi, fake_model, "tracer", "PTRACE-TRACER")
    assert "Seccomp:\t2" in traced and "ptrace-errno 0" in traced, traced
    plain = await _probe(papi, fake_model, "plain", "PTRACE-PLAIN")
    assert "Seccomp:\t2" in plain and "ptrace-errno 1" in plain, plain  # EPERM
    # Another tenant's agent of the same name is not the one the operator named.
    other = await papi.new_tenant_key("other")
    status, body = await papi.call("POST", "/api/agents", json={"name": "tracer", "systemPrompt": "x"}, key=other)
    assert status == 201, body
    foreign = await _probe(papi, fake_model, "tracer", "PTRACE-OTHER", key=other)
    assert "ptrace-errno 1" in foreign, foreign
