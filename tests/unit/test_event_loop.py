"""Which loop `SERVICE_EVENT_LOOP` picks, with uvloop installed and without it."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from ashd import event_loop


async def _name() -> str:
    return event_loop.running_loop_name()


def test_auto_and_uvloop_run_uvloop_when_it_is_installed() -> None:
    assert event_loop.loop_factory("auto") is uvloop.new_event_loop
    assert event_loop.run(_name(), "auto") == "uvloop"
    assert event_loop.run(_name(), "uvloop") == "uvloop"


def test_asyncio_runs_asyncios_own_loop() -> None:
    assert event_loop.loop_factory("asyncio") is None
    assert event_loop.run(_name(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what `import uvloop` meets where it is not installed
    assert event_loop.run(_name(), "auto") == "asyncio"
    with pytest.raises(event_loop.LoopUnavailable, match="SERVICE_EVENT_LOOP is uvloop.*auto or asyncio"):
        event_loop.loop_factory("uvloop")


def test_run_leaves_no_loop_behind() -> None:
    event_loop.run(_name(), "auto")
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
