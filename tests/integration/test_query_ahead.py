"""A turn's query goes to the bridge while its prompt is stored (`SessionActor.begin_turn`, SQLite).
When the database refuses the prompt, the turn fails with an ApiError and leaves no trace: nothing
is stored, the model is never called for it, and the engine's conversation forgets it (the bridge's
`withdraw`). Real HTTP, sandboxes, bridges, fake model; the failure is the database's own (a trigger
that refuses the row), inside the transaction that stores the prompt."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy import text

from ashd.devtools.fake_model import FakeModel
from tests.conftest import Api
from tests.fixtures.fake_model_fixture import fake_model  # noqa: F401
from tests.integration.test_sessions import create, deploy, sapi, send  # noqa: F401

SQLITE_REFUSE = """CREATE TRIGGER refuse_unstorable BEFORE INSERT ON messages
WHEN NEW.content LIKE '%UNSTORABLE%' BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"""
POSTGRES_REFUSE = (
    """CREATE FUNCTION refuse_unstorable() RETURNS trigger AS $$ BEGIN
    IF NEW.content LIKE '%UNSTORABLE%' THEN RAISE EXCEPTION 'refused by a test trigger'; END IF;
    RETURN NEW; END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER refuse_unstorable BEFORE INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION refuse_unstorable()""",
)


async def test_a_prompt_the_database_refuses_leaves_no_trace(sapi: Api, fake_model: FakeModel) -> None:  # noqa: F811
    assert sapi.server.components is not None
    db = sapi.server.components.db
    await deploy(sapi)
    sid = (await create(sapi))["id"]
    status, frames = await send(sapi, sid, "KEPT first")
    assert status == 200, frames
    async with db.engine.begin() as conn:
        for statement in (SQLITE_REFUSE,) if db.dialect == "sqlite" else POSTGRES_REFUSE:
            await conn.execute(text(statement))

    status, body = await send(sapi, sid, "UNSTORABLE second")
    assert status >= 500 and body[0]["statusCode"] == status and body[0]["error"], body
    status, frames = await send(sapi, sid, "STORED third")
    assert status == 200, frames
    assert frames[-1].event == "done"

    # The model never saw the refused prompt, nor a note about an interrupted turn in its place.
    assert not fake_model.requests_containing("UNSTORABLE")
    asked = json.dumps(fake_model.requests_containing("STORED third")[-1]["body"]["messages"])
    assert "KEPT first" in asked and "UNSTORABLE" not in asked and "interrupted" not in asked
    status, body = await sapi.call("GET", f"/api/sessions/{sid}/messages")
    assert status == 200, body
    stored = json.dumps(body)
    assert "KEPT first" in stored and "STORED third" in stored and "UNSTORABLE" not in stored
    status, body = await sapi.call("GET", f"/api/sessions/{sid}")
    assert body["session"]["status"] == "active"

    if db.dialect == "sqlite":  # the query had gone ahead of its prompt: the bridge was told to forget it
        async with asyncio.timeout(30):  # the sandbox's log lines are stored as they are swept
            while not any("withdrawn" in line["text"] for line in (await logs(sapi, sid))):
                await asyncio.sleep(0.2)


async def logs(api: Api, sid: str) -> list[dict[str, Any]]:
    status, body = await api.call("GET", f"/api/sessions/{sid}/logs")
    assert status == 200, body
    return list(body["logs"])
