"""The v1 NDJSON codec and frame reader (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from ashd.bridge import protocol as p


def test_encode_decode_round_trip() -> None:
    frame = {"type": "message", "id": "q1", "data": {"type": "assistant", "text": "héllo\nworld"}}
    data = p.encode(frame)
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1  # newlines inside strings are escaped
    assert p.decode(data) == frame


def test_make_drops_none_fields() -> None:
    assert p.make(p.QUERY, id="q", prompt="hi", model=None) == {"type": "query", "id": "q", "prompt": "hi"}


def test_decode_keeps_unknown_fields_for_readers_to_ignore() -> None:
    frame = p.decode(b'{"type":"ready","protocol":1,"pid":3,"futureField":{"x":1}}')
    assert frame["protocol"] == 1
    assert frame["futureField"] == {"x": 1}


@pytest.mark.parametrize("line", [b"not json", b"[1,2]", b'{"id":"x"}', b'{"type":5}'])
def test_decode_rejects_bad_frames(line: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(line)


def test_encode_refuses_oversized_frame() -> None:
    with pytest.raises(p.FrameTooLarge):
        p.encode({"type": "message", "data": "x" * p.MAX_FRAME_BYTES})


def test_encode_requires_type() -> None:
    with pytest.raises(p.ProtocolError):
        p.encode({"id": "x"})


def test_constants() -> None:
    assert p.PROTOCOL_VERSION == 2
    assert p.SUPPORTED_VERSIONS == (1, 2)
    assert p.MAX_FRAME_BYTES == 16 * 1024 * 1024
    assert {p.HELLO, p.INIT, p.QUERY, p.INTERRUPT, p.EXEC, p.SHUTDOWN, p.PING, p.LIMITS_REPORT,
            p.WITHDRAW} == p.COMMAND_TYPES
    assert {p.READY, p.INIT_OK, p.MESSAGE, p.ERROR, p.DONE, p.LOG, p.EXEC_RESULT, p.PONG,
            p.LIMITS_CHECK} == p.EVENT_TYPES


async def _n(reader: p.FrameReader) -> int:
    frame = await reader.read()
    assert frame is not None
    return int(frame["n"])


async def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def test_reader_splits_and_joins_chunks() -> None:
    a, b = await _pair()
    try:
        reader = p.FrameReader(b)
        loop = asyncio.get_running_loop()
        two = p.encode({"type": "ping", "id": "1"}) + p.encode({"type": "ping", "id": "2"})
        third = p.encode({"type": "pong", "id": "3"})
        await loop.sock_sendall(a, two + third[:5])
        assert (await reader.read()) == {"type": "ping", "id": "1"}
        assert (await reader.read()) == {"type": "ping", "id": "2"}
        await loop.sock_sendall(a, third[5:] + b"\n")  # a blank line is skipped
        assert (await reader.read()) == {"type": "pong", "id": "3"}
        a.close()
        assert await reader.read() is None
    finally:
        a.close()
        b.close()


async def test_a_frame_already_in_the_socket_is_read_without_the_loop() -> None:
    """What the socket holds is read there and then (no task, no loop iteration: a stream's frames
    come in bursts); only an empty socket waits on the loop, and what it then gets is not lost."""
    a, b = await _pair()
    try:
        reader = p.FrameReader(b)
        a.sendall(p.encode({"type": "ping", "id": "1"}))
        step = reader.read()
        with pytest.raises(StopIteration) as done:
            step.send(None)  # one step, without the loop: it finished
        assert done.value.value == {"type": "ping", "id": "1"}
        waiting = asyncio.ensure_future(reader.read())  # nothing there yet: it waits
        await asyncio.sleep(0)
        assert not waiting.done()
        a.sendall(p.encode({"type": "pong", "id": "2"}))
        assert await asyncio.wait_for(waiting, 5) == {"type": "pong", "id": "2"}
    finally:
        a.close()
        b.close()


async def test_reader_discards_oversized_line_and_continues() -> None:
    a, b = await _pair()
    try:
        reader = p.FrameReader(b, max_frame=1024)
        loop = asyncio.get_running_loop()
        big = json.dumps({"type": "message", "data": "x" * 5000}).encode() + b"\n"
        sender = asyncio.create_task(loop.sock_sendall(a, big + p.encode({"type": "ping", "id": "after"})))
        with pytest.raises(p.FrameTooLarge):
            await reader.read()
        assert (await reader.read()) == {"type": "ping", "id": "after"}
        await sender
    finally:
        a.close()
        b.close()


async def test_writer_writes_whole_frames() -> None:
    a, b = await _pair()
    try:
        writer = p.FrameWriter(a)
        reader = p.FrameReader(b)
        # Concurrent writers, a reader draining at the same time: frames never interleave.
        writes = asyncio.gather(*(writer.write({"type": "log", "n": i, "pad": "y" * 100_000}) for i in range(20)))
        seen = sorted([await _n(reader) for _ in range(20)])
        await writes
        assert seen == list(range(20))
    finally:
        a.close()
        b.close()


async def test_a_frame_sent_now_stays_whole_and_first_when_the_socket_takes_part_of_it() -> None:
    a, b = await _pair()
    try:
        p.shrink_buffers(a)
        writer, reader = p.FrameWriter(a), p.FrameReader(b)
        big = {"type": "query", "id": "q-big", "prompt": "x" * (512 * 1024)}
        assert writer.send_now(big)  # the socket takes a part; the rest goes before any later frame
        assert not writer.send_now({"type": "ping", "id": "refused"})  # nothing is sent in its middle
        later = asyncio.create_task(writer.write({"type": "withdraw", "id": "q-big"}))
        assert (await reader.read()) == big
        assert (await reader.read()) == {"type": "withdraw", "id": "q-big"}
        await later
        assert writer.send_now({"type": "ping", "id": "now"})  # idle again: sent at once, whole
        assert (await reader.read()) == {"type": "ping", "id": "now"}
    finally:
        a.close()
        b.close()
