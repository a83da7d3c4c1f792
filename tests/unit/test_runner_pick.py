"""Where a new session goes: `choose` (the alive runner with the most free capacity) and the
registry actor that counts what it placed on each runner since its last heartbeat."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pykka

from ashd.actors import RunnerInfo, RunnerRegistryActor, call, choose
from ashd.backends import parse_frame

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def runner(rid: str, max_sandboxes: int, running: int = 0, warming: int = 0, age: float = 1.0) -> RunnerInfo:
    return RunnerInfo(rid, "10.0.0.1", 4200, max_sandboxes, running, warming, NOW - dt.timedelta(seconds=age))


def test_the_most_available_capacity_wins() -> None:
    # Free: a 10-8 = 2, b 6-1-1 = 4, c 6-5 = 1. The biggest machine is not the emptiest.
    runners = [runner("a", 10, running=8), runner("b", 6, running=1, warming=1), runner("c", 6, running=5)]
    assert choose(runners, NOW, 30).runner_id == "b"  # type: ignore[union-attr]


def test_running_and_warming_count_against_capacity_waiting_does_not() -> None:
    assert choose([runner("a", 4, running=3), runner("b", 3)], NOW, 30).runner_id == "b"  # type: ignore[union-attr]
    assert choose([runner("a", 4, warming=3), runner("b", 3)], NOW, 30).runner_id == "b"  # type: ignore[union-attr]


def test_ties_go_to_the_lowest_id_so_every_coordinator_agrees() -> None:
    assert choose([runner("b", 4), runner("a", 4)], NOW, 30).runner_id == "a"  # type: ignore[union-attr]


def test_silent_and_excluded_runners_are_skipped() -> None:
    assert choose([runner("a", 100, age=31)], NOW, 30) is None  # no heartbeat for longer than liveness
    assert choose([runner("a", 9), runner("b", 1)], NOW, 30, exclude=frozenset({"a"})).runner_id == "b"  # type: ignore[union-attr]
    assert choose([], NOW, 30) is None
    marked = RunnerInfo("a", "h", 1, 9, 0, 0, NOW, dead=True)  # a sweep marked it dead: fresh beat or not
    assert choose([marked], NOW, 30) is None


def test_sessions_placed_since_the_last_heartbeat_count() -> None:
    runners = [runner("a", 3), runner("b", 2)]
    assert choose(runners, NOW, 30, placed={"a": 2}).runner_id == "b"  # type: ignore[union-attr]


def test_a_runner_that_seems_full_is_still_asked_the_one_with_most_room_first() -> None:
    # The estimate counts every session placed since the heartbeat as running, though most may
    # have ended: it orders the runners, and the runner refuses at the door when it is full.
    assert choose([runner("a", 2, running=2)], NOW, 30).runner_id == "a"  # type: ignore[union-attr]
    runners = [runner("a", 2), runner("b", 2)]
    assert choose(runners, NOW, 30, placed={"a": 5, "b": 3}).runner_id == "b"  # type: ignore[union-attr]
    assert choose(runners, NOW, 30, placed={"a": 5, "b": 3}, exclude=frozenset({"b"})).runner_id == "a"  # type: ignore[union-attr]


def test_coordinators_local_pools_take_sessions_only_when_no_runner_has_room() -> None:
    pool = RunnerInfo.from_json({"runnerId": "a-pool", "host": "h", "port": 1, "maxSandboxes": 50,
                                 "stats": {"running": 0, "coordinatorLocal": 1},
                                 "lastHeartbeatAt": NOW.isoformat()})
    assert pool.local_pool and not runner("b", 2).local_pool
    assert choose([pool, runner("b", 2, running=1)], NOW, 30).runner_id == "b"  # type: ignore[union-attr]
    assert choose([pool, runner("b", 2, running=2)], NOW, 30).runner_id == "a-pool"  # type: ignore[union-attr]
    full_pool = RunnerInfo.from_json({"runnerId": "a-pool", "host": "h", "port": 1, "maxSandboxes": 1,
                                      "stats": {"running": 1, "coordinatorLocal": 1},
                                      "lastHeartbeatAt": NOW.isoformat()})
    # Nothing seems to have room: a runner is asked before the fallback pool.
    assert choose([full_pool, runner("b", 2, running=2)], NOW, 30).runner_id == "b"  # type: ignore[union-attr]
    assert choose([pool, runner("b", 2)], NOW, 30, exclude=frozenset({"b"})).runner_id == "a-pool"  # type: ignore[union-attr]


async def test_the_actor_spreads_a_burst_and_reads_again_after_its_ttl() -> None:
    reads = 0
    rows: list[dict[str, Any]] = [
        {"runnerId": "a", "host": "h1", "port": 1, "maxSandboxes": 3, "stats": {"running": 0, "warming": 0},
         "lastHeartbeatAt": dt.datetime.now(dt.UTC).isoformat()},
        {"runnerId": "b", "host": "h2", "port": 2, "maxSandboxes": 1, "stats": {"running": 0, "warming": 0},
         "lastHeartbeatAt": dt.datetime.now(dt.UTC).isoformat()},
    ]

    async def read() -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        return rows

    ref = RunnerRegistryActor.start(asyncio.get_running_loop(), read, 30.0, ttl=0.5)
    try:
        proxy = ref.proxy()
        picked = [(await call(proxy.pick(), 5)) for _ in range(5)]
        # 3 v 1; then both seem full and the tie goes to the lowest id.
        assert [p.runner_id if p else None for p in picked] == ["a", "a", "a", "b", "a"]
        assert reads == 1
        found = await call(proxy.address("b"), 5)
        assert found is not None and found.address == "http://h2:2"
        assert await call(proxy.address("gone"), 5) is None
        await asyncio.sleep(0.6)
        # A fresh read with the same heartbeats: what was placed since them still counts (a burst
        # that outlasts the TTL is spread the same): a 3 - 4, b 1 - 1.
        assert (await call(proxy.pick(), 5)).runner_id == "b"  # type: ignore[union-attr]
        assert reads >= 2
        # A later heartbeat reports its own counts, which include the sessions placed before it.
        beat = dt.datetime.now(dt.UTC).isoformat()
        rows[0] = {**rows[0], "stats": {"running": 1, "warming": 0}, "lastHeartbeatAt": beat}
        rows[1] = {**rows[1], "stats": {"running": 1, "warming": 0}, "lastHeartbeatAt": beat}
        await asyncio.sleep(0.6)
        assert [(await call(proxy.pick(), 5)) for _ in range(3)] == [RunnerInfo.from_json(rows[0])] * 3
    finally:
        await asyncio.to_thread(lambda: ref.stop(block=True, timeout=5))
        pykka.ActorRegistry.stop_all(timeout=5)


def test_sse_blocks_from_a_runner_parse_to_frames() -> None:
    frame = parse_frame(b'id: 7\nevent: message\ndata: {"type":"assistant"}\n\n')
    assert frame is not None and (frame.id, frame.event, frame.data) == (7, "message", '{"type":"assistant"}')
    assert parse_frame(b": ping\n\n") is None
    live = parse_frame(b"event: error\ndata: {\"error\":\"x\"}\n\n")
    assert live is not None and live.id is None and live.event == "error"
    assert parse_frame(b"data: a\ndata: b\n\n").data == "a\nb"  # type: ignore[union-attr]
