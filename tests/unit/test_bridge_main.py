"""The bridge's entry: its log set-up, which a fork server runs once and each child reuses."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    # A fresh interpreter: the root logger's handlers are process-wide state.
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            check=True, timeout=60)
    return result.stderr


def test_a_child_reuses_the_handler_and_takes_its_own_level() -> None:
    err = run("""
        import logging, os
        from ashd.bridge import __main__ as m
        m._configure_logging("INFO")            # what zygote_warm does in the fork server
        handler = logging.getLogger().handlers[0]
        if os.fork() == 0:                      # a sandbox's bridge
            m._configure_logging("debug")
            root = logging.getLogger()
            assert root.handlers == [handler], root.handlers
            assert root.level == logging.DEBUG
            logging.getLogger("ashd.x").debug("from the child")
            logging.getLogger("httpx2").info("chatty")   # kept quiet below WARNING
            os._exit(0)
        os.wait()
        m._configure_logging("no-such-level")  # an unknown name: INFO, as basicConfig's fallback was
        assert logging.getLogger().level == logging.INFO
        logging.getLogger("ashd.x").debug("not shown")
    """)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].endswith(" bridge DEBUG ashd.x: from the child"), err


def test_the_parser_is_built_once() -> None:
    from ashd.bridge import __main__ as m

    assert m._parser() is m._parser()
    args = m._parser().parse_args(["--listen-fd", "3", "--log-level", "WARNING"])
    assert (args.listen_fd, args.log_level, args.socket) == (3, "WARNING", "/run/ashd/bridge.sock")


def test_the_warm_up_leaves_nothing_running_and_logs_nothing() -> None:
    # What the fork server runs once (`zygote_warm`) and a spare bridge runs again: its model socket's
    # handlers must end with it (a handler left waiting was cancelled by `asyncio.run`'s end, with a
    # traceback in the fork server's log at every start; in a bridge it stayed for the bridge's life).
    err = run("""
        import asyncio, gc
        from ashd.bridge import _warm
        _warm.warm()

        async def in_a_running_loop():
            await _warm._one_request()
            await _warm._one_turn()
            await asyncio.sleep(0)
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert not others, others

        asyncio.run(in_a_running_loop())
        gc.collect()
    """)
    assert err == "", err


def test_the_bridge_reads_sockets_and_pipes_below_the_mmap_threshold() -> None:
    """Each read of asyncio's own size (256 KiB) maps and unmaps a fresh buffer; the bridge's
    (`READ_BYTES`) come from the heap. Checked through asyncio itself: what one read delivers."""
    err = run("""
        import asyncio, fcntl, os, socket, sys
        from ashd.bridge import __main__ as m
        m.small_reads()
        big = b"x" * (600 * 1024)

        class Sizes(asyncio.Protocol):
            def __init__(self):
                self.sizes, self.done = [], asyncio.get_running_loop().create_future()
            def data_received(self, data):
                self.sizes.append(len(data))
                if sum(self.sizes) >= len(big) and not self.done.done():
                    self.done.set_result(None)

        async def main():
            loop = asyncio.get_running_loop()
            a, b = socket.socketpair()
            _, sock = await loop.create_connection(Sizes, sock=b)
            loop.run_in_executor(None, a.sendall, big)  # more than a socket's buffer holds
            await sock.done
            r, w = os.pipe()
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1024 * 1024)  # a read could take more than 64 KiB
            _, pipe = await loop.connect_read_pipe(Sizes, os.fdopen(r, "rb", 0))
            loop.run_in_executor(None, os.write, w, big)
            await pipe.done
            print(max(sock.sizes), max(pipe.sizes), file=sys.stderr)

        asyncio.run(main())
    """)
    sock_max, pipe_max = (int(n) for n in err.split())
    assert 0 < sock_max <= 64 * 1024, err
    assert 0 < pipe_max <= 64 * 1024, err
