"""Every operation of the published client `ash-ai-sdk` 0.0.22 (`ash_sdk.api.<tag>.<operation>`),
driven through its own generated functions against a real ashd with the fake model, each answer
parsed into the client's models and its fields checked.

Where a generated function cannot send or read a valid exchange, the test builds that function's own
request (`_get_kwargs`) and sends it with the SDK's httpx client, saying why at the spot:
- `post_api_sessions_id_messages` reads the SSE answer as JSON (the stream's `str` is all it gives);
- the four `/api/internal/runners*` functions take no body (the SDK's spec leaves it out);
- `get_api_sessions_id_workspace` and `get_api_attachments_id` document no 200 schema (bytes):
  `parsed` is None and the bytes are in `content`;
- `post_api_sessions_id_files` documents its 200 without a schema: `parsed` is None.

The guard test at the end enumerates `ash_sdk.api` and fails naming any operation no test drives."""

from __future__ import annotations

import ast
import asyncio
import base64
import importlib
import io
import json
import pkgutil
import tarfile
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from ash_sdk import AshClient, AuthenticatedClient  # type: ignore[import-untyped]
from ash_sdk.api.agents import (  # type: ignore[import-untyped]
    delete_api_agents_name,
    get_api_agents,
    get_api_agents_name,
    get_api_agents_name_files,
    post_api_agents,
)
from ash_sdk.api.credentials import (  # type: ignore[import-untyped]
    delete_api_credentials_id,
    get_api_credentials,
    post_api_credentials,
)
from ash_sdk.api.default import (  # type: ignore[import-untyped]
    get_api_internal_runners,
    post_api_internal_runners_deregister,
    post_api_internal_runners_heartbeat,
    post_api_internal_runners_register,
)
from ash_sdk.api.health import get_health  # type: ignore[import-untyped]
from ash_sdk.api.sessions import (  # type: ignore[import-untyped]
    delete_api_sessions_id,
    get_api_sessions,
    get_api_sessions_id,
    get_api_sessions_id_events,
    get_api_sessions_id_files,
    get_api_sessions_id_logs,
    get_api_sessions_id_messages,
    get_api_sessions_id_workspace,
    post_api_sessions,
    post_api_sessions_id_exec,
    post_api_sessions_id_files,
    post_api_sessions_id_fork,
    post_api_sessions_id_messages,
    post_api_sessions_id_pause,
    post_api_sessions_id_resume,
    post_api_sessions_id_stop,
    post_api_sessions_id_workspace,
)
from ash_sdk.api.usage import get_api_usage, get_api_usage_stats  # type: ignore[import-untyped]
from ash_sdk.models import (  # type: ignore[import-untyped]
    Agent,
    ApiError,
    DeleteApiAgentsNameResponse200,
    DeleteApiSessionsIdResponse200,
    GetApiAgentsNameFilesResponse200,
    GetApiAgentsNameResponse200,
    GetApiAgentsResponse200,
    GetApiCredentialsResponse200,
    GetApiCredentialsResponse200CredentialsItem,
    GetApiSessionsIdEventsResponse200,
    GetApiSessionsIdFilesResponse200,
    GetApiSessionsIdLogsResponse200,
    GetApiSessionsIdMessagesResponse200,
    GetApiSessionsIdResponse200,
    GetApiSessionsResponse200,
    GetApiUsageResponse200,
    GetApiUsageStatsResponse200,
    HealthResponse,
    Message,
    PostApiAgentsBody,
    PostApiAgentsResponse201,
    PostApiCredentialsBody,
    PostApiCredentialsResponse201,
    PostApiSessionsBody,
    PostApiSessionsIdExecBody,
    PostApiSessionsIdExecResponse200,
    PostApiSessionsIdFilesBody,
    PostApiSessionsIdFilesBodyFilesItem,
    PostApiSessionsIdForkResponse201,
    PostApiSessionsIdMessagesBody,
    PostApiSessionsIdPauseResponse200,
    PostApiSessionsIdResumeResponse200,
    PostApiSessionsIdStopResponse200,
    PostApiSessionsIdWorkspaceBody,
    PostApiSessionsIdWorkspaceResponse200,
    PostApiSessionsResponse201,
    Session,
    SessionEvent,
    UsageEvent,
)

from ashd.config import Settings
from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api, start_api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401

pytestmark = pytest.mark.sandbox

SECRET = "sdk-cover-internal-secret"
NOBODY = UUID("00000000-0000-4000-8000-0000000000ff")


@pytest.fixture
async def sdk_api(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> Any:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        internal_secret=SECRET))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


def _client(api: Api, token: str | None = None) -> AuthenticatedClient:
    return AuthenticatedClient(base_url=str(api.client.make_url("")).rstrip("/"), token=token or api.key,
                               timeout=60)


def _tar_gz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def test_sdk_agent_functions(sdk_api: Api, tmp_path: Path) -> None:
    folder = tmp_path / "cover-agent"
    (folder / "docs").mkdir(parents=True)
    (folder / "AGENT.md").write_text("You cover every operation.")
    (folder / "docs" / "notes.txt").write_text("agent notes")
    client = _client(sdk_api)

    def run() -> None:
        created = post_api_agents.sync(client=client, body=PostApiAgentsBody(name="cover-agent", path=str(folder)))
        assert isinstance(created, PostApiAgentsResponse201) and isinstance(created.agent, Agent)
        assert created.agent.name == "cover-agent" and created.agent.version == 1
        assert created.agent.tenant_id == "default" and created.agent.created_at.tzinfo is not None
        again = post_api_agents.sync(client=client, body=PostApiAgentsBody(name="cover-agent", path=str(folder)))
        assert again.agent.version == 2 and again.agent.id == created.agent.id
        bad = post_api_agents.sync(client=client, body=PostApiAgentsBody(name="bad name!", path=str(folder)))
        assert isinstance(bad, ApiError) and bad.status_code == 400 and bad.error

        listed = get_api_agents.sync(client=client)
        assert isinstance(listed, GetApiAgentsResponse200)
        assert [(a.name, a.version) for a in listed.agents] == [("cover-agent", 2)]

        got = get_api_agents_name.sync("cover-agent", client=client)
        assert isinstance(got, GetApiAgentsNameResponse200) and got.agent.id == created.agent.id
        assert got.agent.updated_at >= created.agent.created_at
        assert isinstance(get_api_agents_name.sync("nobody", client=client), ApiError)

        files = get_api_agents_name_files.sync("cover-agent", client=client)
        assert isinstance(files, GetApiAgentsNameFilesResponse200)
        sizes = {f.path: f.size for f in files.files}
        assert sizes["AGENT.md"] == len("You cover every operation.") and sizes["docs/notes.txt"] == 11
        assert all(f.modified_at.tzinfo is not None for f in files.files)
        missing = get_api_agents_name_files.sync("nobody", client=client)
        assert isinstance(missing, ApiError) and missing.status_code == 404

        deleted = delete_api_agents_name.sync("cover-agent", client=client)
        assert isinstance(deleted, DeleteApiAgentsNameResponse200) and deleted.ok is True
        gone = delete_api_agents_name.sync("cover-agent", client=client)
        assert isinstance(gone, ApiError) and gone.status_code == 404

        # AshClient's wrappers of the same operations
        ash = AshClient(client._base_url, token=sdk_api.key, timeout=60)
        assert ash.deploy_agent("cover-agent", str(folder)).name == "cover-agent"
        assert ash.get_agent("cover-agent").version == 1
        assert ash.health()["status"] == "ok"

    await asyncio.to_thread(run)


async def test_sdk_session_functions(sdk_api: Api, fake_model: FakeModel) -> None:  # noqa: F811
    client = _client(sdk_api)
    fake_model.script("COVER-HELLO", [{"content": [{"type": "text", "text": "covered answer"}]}])

    def run() -> None:
        assert isinstance(post_api_agents.sync(client=client, body=PostApiAgentsBody.from_dict(
            {"name": "helper", "systemPrompt": "You are helpful."})), PostApiAgentsResponse201)
        created = post_api_sessions.sync(client=client, body=PostApiSessionsBody(agent="helper", model="m-cover"))
        assert isinstance(created, PostApiSessionsResponse201) and isinstance(created.session, Session)
        session = created.session
        sid = session.id
        assert session.agent_name == "helper" and session.status == "active" and session.sandbox_id
        assert session.tenant_id == "default" and session.created_at.tzinfo is not None
        no_agent = post_api_sessions.sync(client=client, body=PostApiSessionsBody(agent="nobody"))
        assert isinstance(no_agent, ApiError) and no_agent.status_code == 404

        # The generated send function reads the SSE answer as JSON; so: its own request, sent by the
        # SDK's own httpx client.
        kwargs = post_api_sessions_id_messages._get_kwargs(sid, body=PostApiSessionsIdMessagesBody(content="COVER-HELLO"))
        sent = client.get_httpx_client().request(**kwargs)
        assert sent.status_code == 200 and sent.headers["content-type"].startswith("text/event-stream")
        assert "covered answer" in sent.text and f'event: done\ndata: {{"sessionId": "{sid}"}}' in sent.text

        listed = get_api_sessions.sync(client=client, agent="helper")
        assert isinstance(listed, GetApiSessionsResponse200) and [s.id for s in listed.sessions] == [sid]
        assert get_api_sessions.sync(client=client, agent="nobody").sessions == []
        got = get_api_sessions_id.sync(sid, client=client)
        assert isinstance(got, GetApiSessionsIdResponse200) and got.session.id == sid
        assert got.session.last_active_at >= session.created_at
        assert isinstance(get_api_sessions_id.sync(NOBODY, client=client), ApiError)

        messages = get_api_sessions_id_messages.sync(sid, client=client)
        assert isinstance(messages, GetApiSessionsIdMessagesResponse200)
        assert all(isinstance(m, Message) and m.session_id == sid for m in messages.messages)
        # the user's message, then what the agent said: its assistant message and its result
        assert [m.role for m in messages.messages] == ["user", "assistant", "assistant"], messages.to_dict()
        assert "COVER-HELLO" in messages.messages[0].content
        assert all("covered answer" in m.content for m in messages.messages[1:]), messages.to_dict()
        assert [m.sequence for m in messages.messages] == sorted(m.sequence for m in messages.messages)
        later = get_api_sessions_id_messages.sync(sid, client=client, after=messages.messages[0].sequence)
        assert [m.id for m in later.messages] == [m.id for m in messages.messages[1:]]

        events = get_api_sessions_id_events.sync(sid, client=client)
        assert isinstance(events, GetApiSessionsIdEventsResponse200)
        assert all(isinstance(e, SessionEvent) and e.session_id == sid for e in events.events)
        assert {"lifecycle", "text"} <= {e.type_ for e in events.events}
        lifecycle = get_api_sessions_id_events.sync(sid, client=client, type_="lifecycle", limit=1)
        assert len(lifecycle.events) == 1 and json.loads(lifecycle.events[0].data)["action"] == "created"
        assert isinstance(get_api_sessions_id_events.sync(NOBODY, client=client), ApiError)

        # Upload: its 200 has no schema in the SDK's spec, so `parsed` is None; the JSON is checked raw.
        upload = post_api_sessions_id_files.sync_detailed(sid, client=client, body=PostApiSessionsIdFilesBody(
            files=[PostApiSessionsIdFilesBodyFilesItem(path="in/data.txt", content=base64.b64encode(b"uploaded").decode())],
            target_path="."))
        assert upload.status_code == 200 and upload.parsed is None, upload.content
        assert [f["path"] for f in json.loads(upload.content)["files"]] == ["in/data.txt"]

        files = get_api_sessions_id_files.sync(sid, client=client)
        assert isinstance(files, GetApiSessionsIdFilesResponse200) and files.source == "sandbox"
        by_path = {f.path: f for f in files.files}
        assert by_path["in/data.txt"].size == len(b"uploaded")
        assert by_path["in/data.txt"].modified_at.tzinfo is not None
        hidden = get_api_sessions_id_files.sync(sid, client=client, include_hidden="true")
        assert {f.path for f in files.files} <= {f.path for f in hidden.files}

        ran = post_api_sessions_id_exec.sync(sid, client=client, body=PostApiSessionsIdExecBody(
            command="cat in/data.txt; echo oops >&2; exit 3", timeout=30000))
        assert isinstance(ran, PostApiSessionsIdExecResponse200)
        assert (ran.exit_code, ran.stdout, ran.stderr) == (3, "uploaded", "oops\n")
        empty = post_api_sessions_id_exec.sync(sid, client=client, body=PostApiSessionsIdExecBody(command=""))
        assert isinstance(empty, ApiError) and empty.status_code == 400

        logs = get_api_sessions_id_logs.sync(sid, client=client)
        assert isinstance(logs, GetApiSessionsIdLogsResponse200) and isinstance(logs.source, str)
        assert all(isinstance(line.index, int) for line in logs.logs)

        # Workspace download: no 200 schema in the SDK's spec, the tar.gz is in `content`.
        bundle = get_api_sessions_id_workspace.sync_detailed(sid, client=client)
        assert bundle.status_code == 200 and bundle.parsed is None
        with tarfile.open(fileobj=io.BytesIO(bundle.content), mode="r:gz") as tar:
            member = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("in/data.txt")))
            assert member is not None and member.read() == b"uploaded"
        restored = post_api_sessions_id_workspace.sync(sid, client=client, body=PostApiSessionsIdWorkspaceBody(
            bundle=base64.b64encode(_tar_gz({"from-bundle.txt": b"bundled"})).decode()))
        assert isinstance(restored, PostApiSessionsIdWorkspaceResponse200), restored
        assert isinstance(restored.message, str) and restored.message
        check = post_api_sessions_id_exec.sync(sid, client=client, body=PostApiSessionsIdExecBody(
            command="cat from-bundle.txt"))
        assert check.stdout == "bundled" and check.exit_code == 0
        broken = post_api_sessions_id_workspace.sync(sid, client=client, body=PostApiSessionsIdWorkspaceBody(
            bundle="not base64!"))
        assert isinstance(broken, ApiError) and broken.status_code == 400
        missing = get_api_sessions_id_workspace.sync_detailed(NOBODY, client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, ApiError)

        forked = post_api_sessions_id_fork.sync(sid, client=client)
        assert isinstance(forked, PostApiSessionsIdForkResponse201)
        assert forked.session.parent_session_id == sid and forked.session.id != sid
        assert forked.session.agent_name == "helper"
        child = forked.session.id

        paused = post_api_sessions_id_pause.sync(sid, client=client)
        assert isinstance(paused, PostApiSessionsIdPauseResponse200) and paused.session.status == "paused"
        twice = post_api_sessions_id_pause.sync(sid, client=client)
        assert isinstance(twice, ApiError) and twice.status_code == 400
        resumed = post_api_sessions_id_resume.sync(sid, client=client)
        assert isinstance(resumed, PostApiSessionsIdResumeResponse200) and resumed.session.status == "active"
        stopped = post_api_sessions_id_stop.sync(sid, client=client)
        assert isinstance(stopped, PostApiSessionsIdStopResponse200) and stopped.session.status == "stopped"
        again = post_api_sessions_id_stop.sync(sid, client=client)
        assert isinstance(again, ApiError) and again.status_code == 400
        ended = delete_api_sessions_id.sync(sid, client=client)
        assert isinstance(ended, DeleteApiSessionsIdResponse200) and ended.session.status == "ended"
        assert ended.session.id == sid
        assert isinstance(delete_api_sessions_id.sync(NOBODY, client=client), ApiError)
        assert delete_api_sessions_id.sync(child, client=client).session.status == "ended"
        after = get_api_sessions_id_events.sync(sid, client=client, type_="lifecycle")
        assert [json.loads(e.data)["action"] for e in after.events] == [
            "created", "forked", "paused", "resumed", "stopped", "ended"]

        # AshClient's wrappers: stop and fork
        ash = AshClient(client._base_url, token=sdk_api.key, timeout=60)
        other = ash.create_session("helper")
        assert ash.fork_session(other.id).parent_session_id == other.id
        assert ash.stop_session(other.id).status == "stopped"

    await asyncio.to_thread(run)


async def test_sdk_credential_usage_and_health_functions(sdk_api: Api, fake_model: FakeModel) -> None:  # noqa: F811
    client = _client(sdk_api)
    fake_model.script("COVER-USAGE", [{"content": [{"type": "text", "text": "counted"}]}])

    def run() -> None:
        health = get_health.sync(client=client)
        assert isinstance(health, HealthResponse) and health.status == "ok"
        assert health.active_sessions == 0 and health.uptime >= 0 and isinstance(health.version, str)
        assert health.pool.total >= 0

        created = post_api_credentials.sync(client=client, body=PostApiCredentialsBody(
            type_="anthropic", key="sk-ant-cover-credential", label="cover"))
        assert isinstance(created, PostApiCredentialsResponse201) and created.credential is not None
        cred = created.credential
        assert cred.type_ == "anthropic" and cred.label == "cover" and cred.active is True and cred.id
        assert "sk-ant-cover-credential" not in json.dumps(created.to_dict())
        bad = post_api_credentials.sync(client=client, body=PostApiCredentialsBody(type_="anthropic", key=""))
        assert isinstance(bad, ApiError) and bad.status_code == 400

        listed = get_api_credentials.sync(client=client)
        assert isinstance(listed, GetApiCredentialsResponse200)
        assert all(isinstance(c, GetApiCredentialsResponse200CredentialsItem) for c in listed.credentials)
        assert [(c.id, c.type_, c.label, c.active) for c in listed.credentials] == [(cred.id, "anthropic", "cover", True)]
        assert listed.credentials[0].created_at == cred.created_at and listed.credentials[0].last_used_at is None
        # the item model lacks only tenantId (its `Credential` schema has it); never the key
        assert listed.credentials[0].additional_properties == {"tenantId": "default"}

        post_api_agents.sync(client=client, body=PostApiAgentsBody.from_dict({"name": "helper", "systemPrompt": "Hi."}))
        sid = post_api_sessions.sync(client=client, body=PostApiSessionsBody(agent="helper")).session.id
        kwargs = post_api_sessions_id_messages._get_kwargs(sid, body=PostApiSessionsIdMessagesBody(content="COVER-USAGE"))
        assert "event: done" in client.get_httpx_client().request(**kwargs).text  # SSE: see the module docstring

        usage = get_api_usage.sync(client=client, session_id=sid)
        assert isinstance(usage, GetApiUsageResponse200) and usage.events
        assert all(isinstance(e, UsageEvent) and e.session_id == sid and e.agent_name == "helper"
                   for e in usage.events)
        assert {"input_tokens", "output_tokens", "message"} <= {e.event_type for e in usage.events}
        assert get_api_usage.sync(client=client, agent_name="nobody").events == []
        stats = get_api_usage_stats.sync(client=client, session_id=sid)
        assert isinstance(stats, GetApiUsageStatsResponse200)
        assert stats.stats.total_messages >= 1 and stats.stats.total_input_tokens > 0
        assert stats.stats.total_output_tokens > 0
        assert get_api_usage_stats.sync(client=client, agent_name="nobody").stats.total_messages == 0

        deleted = delete_api_credentials_id.sync_detailed(cred.id, client=client)
        assert deleted.status_code == 204
        gone = delete_api_credentials_id.sync(cred.id, client=client)
        assert isinstance(gone, ApiError) and gone.status_code == 404
        assert get_api_credentials.sync(client=client).credentials == []

    await asyncio.to_thread(run)
    # the generated `asyncio` variants parse the same models (here on the server's own event loop)
    health = await get_health.asyncio(client=client)
    assert isinstance(health, HealthResponse) and health.status == "ok" and health.active_sessions == 1
    usage = await get_api_usage.asyncio(client=client, agent_name="helper", limit=1)
    assert isinstance(usage, GetApiUsageResponse200) and len(usage.events) == 1


async def test_sdk_internal_runner_functions(sdk_api: Api) -> None:
    internal = _client(sdk_api, token=SECRET)
    tenant = _client(sdk_api)

    def send(module: Any, body: dict[str, Any]) -> Any:
        # The SDK's runner functions send no body (its spec declares none): their own request, with
        # the body the endpoint needs, sent by the SDK's httpx client.
        response = internal.get_httpx_client().request(**module._get_kwargs(), json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def run() -> None:
        # With no body, the generated function's exchange is the server's 400, parsed as nothing.
        bare = post_api_internal_runners_register.sync_detailed(client=internal)
        assert bare.status_code == 400 and bare.parsed is None and "body is empty" in bare.content.decode()
        assert post_api_internal_runners_register.sync_detailed(client=tenant).status_code == 401

        assert send(post_api_internal_runners_register, {
            "runnerId": "sdk-runner", "host": "10.0.0.9", "port": 4200, "maxSandboxes": 7}) == {"ok": True}
        assert send(post_api_internal_runners_heartbeat, {
            "runnerId": "sdk-runner", "activeCount": 2, "stats": {"total": 3}}) == {"ok": True}
        listed = get_api_internal_runners.sync_detailed(client=internal)
        assert listed.status_code == 200 and listed.parsed is None  # no 200 schema in the SDK's spec
        body = json.loads(listed.content)
        assert body["count"] == 1 and body["hasLocal"] is True
        runner = body["runners"][0]
        assert (runner["runnerId"], runner["host"], runner["port"], runner["maxSandboxes"]) == (
            "sdk-runner", "10.0.0.9", 4200, 7)
        assert runner["activeCount"] == 2
        assert send(post_api_internal_runners_deregister, {"runnerId": "sdk-runner"}) == {
            "ok": True, "pausedSessions": 0}
        assert json.loads(get_api_internal_runners.sync_detailed(client=internal).content)["count"] == 0

    await asyncio.to_thread(run)


# --- the guard: every operation of the SDK is driven by some test ----------------------------------

def _operations() -> set[str]:
    import ash_sdk.api  # type: ignore[import-untyped]

    found = set()
    for tag in pkgutil.iter_modules(ash_sdk.api.__path__):
        package = importlib.import_module(f"ash_sdk.api.{tag.name}")
        found |= {f"{tag.name}.{op.name}" for op in pkgutil.iter_modules(package.__path__)}
    return found


def _driven(source: str) -> set[str]:
    """The registry: operations a test module imports from `ash_sdk.api.<tag>` and then calls
    (`<operation>.sync`, `.sync_detailed`, `.asyncio*` or `._get_kwargs`) in a test function."""
    tree = ast.parse(source)
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ash_sdk.api."):
            tag = (node.module or "").removeprefix("ash_sdk.api.")
            imported |= {alias.asname or alias.name: f"{tag}.{alias.name}" for alias in node.names}
    called = set()
    for function in ast.walk(tree):
        if not (isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef) and function.name.startswith("test_")):
            continue
        for node in ast.walk(function):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                    and node.attr in ("sync", "sync_detailed", "asyncio", "asyncio_detailed", "_get_kwargs")):
                called.add(imported[node.value.id])
            elif isinstance(node, ast.Name) and node.id in imported and isinstance(node.ctx, ast.Load):
                # passed on to a helper that sends it (as test_sdk_internal_runner_functions does)
                called.add(imported[node.id])
    return called


def test_every_sdk_operation_is_driven_by_a_test() -> None:
    tests = Path(__file__).resolve().parents[1]
    driven: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        for operation in _driven(path.read_text()):
            driven.setdefault(operation, []).append(str(path.relative_to(tests)))
    operations = _operations()
    assert len(operations) >= 42, sorted(operations)  # 0.0.22 has 42; fewer means the scan broke
    missing = sorted(operations - set(driven))
    assert not missing, f"ash_sdk operations no test drives: {missing}"
    assert set(driven) <= operations, sorted(set(driven) - operations)  # a typo'd or removed operation


def test_the_guard_sees_an_operation_that_is_only_imported() -> None:
    source = "from ash_sdk.api.health import get_health\n\ndef test_x() -> None:\n    pass\n"
    assert _driven(source) == set()
    assert _driven(source + "    get_health.sync(client=None)\n") == {"health.get_health"}


@pytest.fixture
async def small_window(aiohttp_client: Any, settings: Settings, fake_model: FakeModel) -> Any:  # noqa: F811
    server, api = await start_api(aiohttp_client, settings.with_(
        zygote=True, anthropic_base_url=fake_model.url, anthropic_api_key="sk-ant-test-server-key",
        model_context_window=20_000))
    try:
        yield api
    finally:
        await api.client.close()
        await server.stop()


async def test_sdk_reads_the_events_and_messages_of_a_compacted_turn(small_window: Api,
                                                                     fake_model: FakeModel) -> None:  # noqa: F811
    from ashd.bridge.engine._compact import SUMMARY_INSTRUCTION

    def bash(char: str) -> dict[str, Any]:
        return {"type": "tool_use", "name": "Bash", "input": {"command": f"python3 -c \"print('{char}' * 20000)\""}}

    fake_model.script(SUMMARY_INSTRUCTION[:60], [{"content": [{"type": "text", "text": "SUMMARY-SDK"}]}])
    fake_model.script("SDK-OVF", [{"content": [bash("a")]}, {"content": [bash("b")]},
                                  {"content": [{"type": "text", "text": "sdk overflow done"}]}], sequential=True)
    client = _client(small_window)

    def run() -> None:
        post_api_agents.sync(client=client, body=PostApiAgentsBody.from_dict({"name": "helper", "systemPrompt": "Hi."}))
        sid = post_api_sessions.sync(client=client, body=PostApiSessionsBody(agent="helper", model="claude-fake")).session.id
        kwargs = post_api_sessions_id_messages._get_kwargs(sid, body=PostApiSessionsIdMessagesBody(content="SDK-OVF go"))
        assert "sdk overflow done" in client.get_httpx_client().request(**kwargs).text
        # Found here: the unfiltered list used to carry the `compaction` event, which the SDK's
        # SessionEvent rejects (TypeError: Unexpected value 'compaction'); it is listed on request only.
        events = get_api_sessions_id_events.sync(sid, client=client)
        assert isinstance(events, GetApiSessionsIdEventsResponse200)
        types = [e.type_ for e in events.events]
        assert {"tool_start", "tool_result", "text", "turn_complete", "lifecycle"} <= set(types)
        assert types.count("tool_start") == 2
        sequences = [e.sequence for e in events.events]
        assert sequences == sorted(sequences)
        # asked for by type, the raw answer has it (the SDK's parser would still reject it)
        kwargs = get_api_sessions_id_events._get_kwargs(sid, type_="compaction")
        [compaction] = client.get_httpx_client().request(**kwargs).json()["events"]
        assert compaction["type"] == "compaction" and json.loads(compaction["data"])["trigger"] == "auto"
        assert compaction["sequence"] not in sequences

        messages = get_api_sessions_id_messages.sync(sid, client=client, limit=100)
        assert isinstance(messages, GetApiSessionsIdMessagesResponse200)
        roles = [m.role for m in messages.messages]
        assert roles[0] == "user" and "assistant" in roles
        assert any("compact_boundary" in m.content for m in messages.messages)

    await asyncio.to_thread(run)
