"""Under CI=true a missing capability fails the tests that need it instead of skipping them.

A skip is green: on a CI host without isolation, root, nft or PostgreSQL the isolation, pool,
lifecycle, network, disk and PostgreSQL suites would vanish while CI stays green. Each guard is
checked here with its requirement made to fail, outside CI (skip) and under CI=true (fail).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fixtures import databases, sandboxes, small_fs
from tests.integration import test_sandbox_disk, test_sandbox_network
from tests.unit import test_egress_policy


def _outcome(guard: Callable[[], object]) -> str:
    try:
        guard()
    except pytest.skip.Exception:
        return "skipped"
    except pytest.fail.Exception:
        return "failed"
    return "ran"


async def _postgres() -> None:
    async for _url in databases.fresh_postgres():
        raise AssertionError("PostgreSQL answered on a port where nothing listens")


def _pg_guard() -> None:
    import asyncio

    asyncio.run(_postgres())


@pytest.fixture
def nothing_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every capability the guards look for, gone."""
    monkeypatch.setattr(sandboxes, "isolation_problems", lambda: ["no isolation on this host"])
    monkeypatch.setattr(test_sandbox_disk, "disk_quota_problems", lambda: ["no loop devices"])
    monkeypatch.setattr("shutil.which", lambda *_a, **_k: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(databases, "PG_URL", "postgresql+asyncpg://postgres@127.0.0.1:9/none")


GUARDS: dict[str, Callable[[], object]] = {
    "isolation": sandboxes.require_isolation,
    "network": test_sandbox_network.require_network,
    "disk quota": test_sandbox_disk.require_disk_quota,
    "mount": small_fs.require_mount,
    "nft": test_egress_policy.require_nft,
    "postgres": _pg_guard,
}


@pytest.mark.usefixtures("nothing_available")
@pytest.mark.parametrize("name", sorted(GUARDS))
def test_a_missing_capability_skips_outside_ci_and_fails_under_ci(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = GUARDS[name]
    monkeypatch.delenv("CI", raising=False)
    assert _outcome(guard) == "skipped"
    monkeypatch.setenv("CI", "true")
    assert _outcome(guard) == "failed"
