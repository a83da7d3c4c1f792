"""A session's anthropic credential: in every model request the session makes, never in its sandbox.

Through real HTTP, a real sandbox and the fake model: the agent runs `env` and reads every
process environment it can see inside its sandbox; the credential's key (and any ANTHROPIC_*
value the session's own environment tried to plant) must not be there, while the model proxy
sends the key with every model request of the session.
"""

from __future__ import annotations

import pytest

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

pytestmark = pytest.mark.sandbox

SECRET = "sk-ant-credential-0123456789abcdef"
PLANTED = "sk-ant-planted-by-session-env-42"
SERVER_KEY = "sk-ant-test-server-key"  # sapi's SERVICE_ANTHROPIC_API_KEY
DUMP = "env > env.txt; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done >> env.txt 2>/dev/null; true"


async def test_anthropic_credential_reaches_the_model_and_never_the_sandbox(
        sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    await deploy(sapi)
    status, body = await sapi.call("POST", "/api/credentials", json={"type": "anthropic", "key": SECRET})
    assert status == 201, body
    session = await create(sapi, credentialId=body["credential"]["id"],
                           extraEnv={"ANTHROPIC_API_KEY": PLANTED, "ANTHROPIC_AUTH_TOKEN": PLANTED,
                                     "PROBE_MARK": "probe-visible"})
    fake_model.script("CRED-ENV", [
        {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": DUMP}}]},
        {"content": [{"type": "text", "text": "dumped"}]},
    ])
    status, frames = await send(sapi, session["id"], "CRED-ENV please")
    assert status == 200 and frames[-1].event == "done", frames

    requests = fake_model.requests_containing("CRED-ENV")
    assert len(requests) == 2  # the prompt and the tool result: both paid with the credential
    assert [r["headers"].get("x-api-key") for r in requests] == [SECRET, SECRET]

    status, text = await sapi.call("GET", f"/api/sessions/{session['id']}/files/env.txt?format=raw")
    assert status == 200, text
    assert "PROBE_MARK=probe-visible" in text  # the dump saw the session's environment
    for secret in (SECRET, PLANTED, SERVER_KEY):
        assert secret not in text
    for request in requests:  # nor did it travel to the model inside a tool result
        assert SECRET not in str(request["body"]) and PLANTED not in str(request["body"])
