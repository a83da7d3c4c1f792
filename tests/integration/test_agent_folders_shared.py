"""Managed agent folders live in the database: a deploy through one process's storage is built
into another process's data dir on first use, whole and atomically; redeploys, deletes and folders
deployed before the database held them."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from ashd.errors import NotFound
from ashd.storage import AgentFile, Agents, AgentVersion, Cipher, Database
from ashd.storage._models import Agent

FILES = [AgentFile("AGENT.md", b"You are the shared agent."), AgentFile("tools/run.py", b"print('hi')\n"),
         AgentFile(".agent/notes.txt", bytes(range(256)) * 64)]


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


async def test_deploy_in_one_process_materialise_in_another(db_url: str, tmp_path: Path) -> None:
    key = secrets.token_bytes(32)
    db_a, db_b = await Database.open(db_url), await Database.open(db_url)
    try:
        a = Agents(db_a, Cipher(key), tmp_path / "a")
        b = Agents(db_b, Cipher(key), tmp_path / "b")
        deployed = await a.deploy("default", "shared", files=FILES, env={"TOKEN": "t0"})
        assert deployed.version == 1 and Path(deployed.path).is_relative_to(tmp_path / "a")

        # Several sessions of process B start at once: one folder is built, every caller gets it.
        views = await asyncio.gather(*(b.resolve("default", "shared") for _ in range(5)))
        built = tmp_path / "b" / "agents" / "default" / "shared" / "v1"
        assert {Path(v.path) for v in views} == {built}
        assert tree(built) == {f.path: f.data for f in FILES} == tree(Path(deployed.path))
        assert views[0].env == {"TOKEN": "t0"}
        assert not list(built.parent.glob(".staging-*"))  # built aside, then renamed into place
        assert await b.folder("default", "shared") == built

        # A redeploy through A is what B builds next; the previous version stays, older ones go.
        await a.deploy("default", "shared", files=[AgentFile("AGENT.md", b"v2")])
        assert tree(Path((await b.resolve("default", "shared")).path)) == {"AGENT.md": b"v2"}
        await a.deploy("default", "shared", system_prompt="v3")
        v3 = Path((await b.resolve("default", "shared")).path)
        assert v3.name == "v3" and tree(v3) == {"AGENT.md": b"v3"}
        assert sorted(p.name for p in v3.parent.glob("v*")) == ["v2", "v3"]

        # Deleted and deployed again under the same name: version 1 again, B must not serve its old v1.
        await a.delete("default", "shared")
        with pytest.raises(NotFound):
            await b.resolve("default", "shared")
        await a.deploy("default", "shared", files=[AgentFile("AGENT.md", b"reborn")])
        again = Path((await b.resolve("default", "shared")).path)
        assert again.name == "v1" and tree(again) == {"AGENT.md": b"reborn"}
    finally:
        await db_a.close()
        await db_b.close()


async def test_folders_from_before_are_imported_at_start(db_url: str, tmp_path: Path) -> None:
    key = secrets.token_bytes(32)
    db = await Database.open(db_url)
    try:
        a = Agents(db, Cipher(key), tmp_path / "a")
        await a.deploy("default", "old", files=FILES)
        async with db.tx() as s:  # as deployed before migration 10: only on A's disk
            await s.execute(delete(AgentVersion))
        b = Agents(db, Cipher(key), tmp_path / "b")
        with pytest.raises(NotFound) as refused:
            await b.resolve("default", "old")
        assert "redeploy the agent" in refused.value.message
        assert Path((await a.resolve("default", "old")).path).is_dir()  # A still serves its own copy
        assert await a.import_local_folders() == 1  # what A's start does
        assert await a.import_local_folders() == 0
        assert tree(Path((await b.resolve("default", "old")).path)) == {f.path: f.data for f in FILES}
    finally:
        await db.close()


async def test_a_sole_writer_resolves_from_what_it_knows_and_forgets_it_on_every_change(tmp_path: Path) -> None:
    """A server on its own SQLite keeps the agent rows it resolved (no read per create) and forgets
    them when it changes an agent: a redeploy, a patch, a delete are seen by the next resolve."""
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ashd.db'}")
    try:
        agents = Agents(db, Cipher(secrets.token_bytes(32)), tmp_path / "a", sole_writer=True)
        await agents.deploy("default", "kept", files=FILES, env={"TOKEN": "t0"}, model="m1")
        first = await agents.resolve("default", "kept")
        async with db.tx() as s:  # behind its back (never done to a running server): proves it is not read
            await s.execute(update(Agent).where(Agent.name == "kept").values(model="changed-behind"))
        assert await agents.resolve("default", "kept") == first and first.model == "m1"

        await agents.patch("default", "kept", env={"TOKEN": "t1"}, model="m2", network=True)
        patched = await agents.resolve("default", "kept")
        assert (patched.env, patched.model, patched.network) == ({"TOKEN": "t1"}, "m2", True)
        await agents.deploy("default", "kept", files=[AgentFile("AGENT.md", b"v2")])
        redeployed = await agents.resolve("default", "kept")
        assert redeployed.version == 2 and tree(Path(redeployed.path)) == {"AGENT.md": b"v2"}
        await agents.delete("default", "kept")
        with pytest.raises(NotFound):
            await agents.resolve("default", "kept")
        with pytest.raises(NotFound):
            await agents.resolve("other-tenant", "kept")
    finally:
        await db.close()
