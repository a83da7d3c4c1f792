"""The server's stderr writer: a reader that stalls never blocks a write, and what it missed
comes in order once it reads again, or is counted as dropped past the backlog's bound. Over a
real pipe (a container runtime's log driver) and a real socket pair (journald)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from ashd._stderr import StderrWriter

LINES = 5_000  # about 600 KB: ten times a pipe's buffer


def _line(i: int) -> bytes:
    return json.dumps({"msg": f"line {i}", "pad": "x" * 100}).encode() + b"\n"


@pytest.fixture(params=["pipe", "socket"])
def channel(request: pytest.FixtureRequest) -> Iterator[tuple[int, Callable[[], bytes]]]:
    """(the descriptor written to, a function that reads everything written to it so far)."""
    with contextlib.ExitStack() as stack:
        if request.param == "pipe":
            read_fd, write_fd = os.pipe()
            stack.callback(os.close, read_fd)
            stack.callback(os.close, write_fd)
        else:
            a, b = socket.socketpair()
            stack.enter_context(a)
            stack.enter_context(b)
            read_fd, write_fd = a.fileno(), b.fileno()
        os.set_blocking(read_fd, False)

        def drain() -> bytes:
            got = b""
            while True:
                try:
                    chunk = os.read(read_fd, 1 << 20)
                except BlockingIOError:
                    return got
                if not chunk:
                    return got
                got += chunk

        yield write_fd, drain


def _write_from_a_thread(writer: StderrWriter, lines: list[bytes]) -> None:
    """The writes, from a thread the test can give up on: a write that blocks would hang it."""
    done = threading.Event()

    def run() -> None:
        for line in lines:
            writer.write(line)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "a write blocked on a reader that does not read"


def _read_until(drain: Callable[[], bytes], want: Callable[[bytes], bool]) -> bytes:
    got = b""
    for _ in range(3000):
        got += drain()
        if want(got):
            return got
        threading.Event().wait(0.01)
    raise AssertionError(f"read {len(got)} bytes, not what was expected")


def test_a_reader_that_stalls_blocks_no_write_and_gets_every_line_in_order(
        channel: tuple[int, Callable[[], bytes]]) -> None:
    fd, drain = channel
    writer = StderrWriter(fd)
    lines = [_line(i) for i in range(LINES)]
    _write_from_a_thread(writer, lines)  # nothing reads meanwhile
    expected = b"".join(lines)
    got = _read_until(drain, lambda got: len(got) >= len(expected))
    assert got == expected
    assert writer.flush(5)
    writer.write(b"after\n")  # the backlog is empty again: straight to the reader
    assert _read_until(drain, lambda got: got.endswith(b"after\n")) == b"after\n"


def test_past_the_backlog_bound_lines_are_dropped_and_counted(channel: tuple[int, Callable[[], bytes]]) -> None:
    fd, drain = channel
    writer = StderrWriter(fd, max_backlog=64 * 1024)
    lines = [_line(i) for i in range(LINES)]
    _write_from_a_thread(writer, lines)
    got = b""
    for _ in range(3000):  # until the writer has nothing left, then what it wrote last
        got += drain()
        if writer.flush(0):
            break
        threading.Event().wait(0.01)
    got += drain()
    out = [json.loads(line) for line in got.splitlines()]  # whole lines only: none was torn
    # Whole lines, in order; each warning stands where the lines it counts were dropped.
    following = warnings = 0
    for o in out:
        if "dropped" in o:
            assert o["level"] == "warning" and o["dropped"] > 0
            following += o["dropped"]
            warnings += 1
        else:
            assert o["msg"] == f"line {following}"
            following += 1
    assert following == LINES and warnings >= 1
