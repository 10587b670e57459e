"""Every HTTP listener under a descriptor flood: a real server process with a low RLIMIT_NOFILE.

The server (``HttpServer``, as every service but the pusher runs it) is a child process
with soft = hard RLIMIT_NOFILE 200, so a few hundred idle connections exhaust it. Each
test floods it with real sockets, waits for the header deadline to free them (an event:
the server closing them), and then checks that a normal request is answered, what was
counted, and what was logged.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from services.common.fdlimits import connection_cap, raise_nofile_limit

NOFILE = 200

SERVER = textwrap.dedent(
    """
    import asyncio, logging, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))
    from fastapi import FastAPI
    from services.common.http import HttpServer, health_router
    from services.common.http_limits import HttpLimits
    from services.common.metrics import ServiceMetrics

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    async def main():
        metrics = ServiceMetrics("flooded")
        app = FastAPI()
        app.include_router(health_router(metrics))
        server = HttpServer(app, "127.0.0.1", 0, "flooded HTTP", metrics=metrics,
                            limits=HttpLimits(header_timeout_s=1.0))
        await server.start()
        # eat the margin the cap leaves, so that accept() itself runs out
        hog = [os.open("/dev/null", os.O_RDONLY) for _ in range({hog})]
        print(server.port, server.max_connections, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@contextmanager
def _server(tmp_path: Path, hog: int) -> Iterator[tuple[int, int, Path]]:
    log = tmp_path / "server.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER.format(nofile=NOFILE, hog=hog)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, log.read_text()
        port, cap = map(int, line.split())
        yield port, cap, log
    finally:
        proc.kill()
        proc.wait()


def _flood(stack: ExitStack, port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30))
        socks.append(s)
    return socks


def _until_closed(socks: list[socket.socket]) -> list[bytes]:
    """What the server sent each socket before it closed it (the header deadline or a 503)."""
    got = []
    for s in socks:
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        got.append(data)
    return got


def _wait_for(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll for an event the server shows only in its log; bounded so a failure ends."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M))


def test_the_connection_cap_stays_below_the_descriptor_limit() -> None:
    assert connection_cap(10_000, 1024) == 1024 - 128
    assert connection_cap(100, 1024) == 100
    assert connection_cap(10_000, 100) == 36  # at least 64 descriptors kept for the rest
    before, now = raise_nofile_limit()
    assert now >= before


def test_connections_over_the_cap_get_503_and_the_server_recovers(tmp_path: Path) -> None:
    with _server(tmp_path, hog=0) as (port, cap, log):
        assert cap == NOFILE - 64
        with ExitStack() as stack:
            socks = _flood(stack, port, cap + 60)
            got = _until_closed(socks)
        refused = [g for g in got if g.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= 50, "the connections over the cap were answered at once"
        assert all(b"retry-after: 1" in g for g in refused)
        timed_out = [g for g in got if g.startswith(b"HTTP/1.1 408")]
        assert len(timed_out) + len(refused) == len(got)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200
        assert _metric(port, "kelvin_flooded_http_connections_refused_total") == len(refused)
        assert "Traceback" not in log.read_text()


def test_out_of_descriptors_is_counted_and_logged_once_not_a_traceback_per_try(
    tmp_path: Path,
) -> None:
    # the margin eaten: the accept()s past what is left fail with EMFILE for a while
    with _server(tmp_path, hog=60) as (port, cap, log):
        with ExitStack() as stack:
            socks = _flood(stack, port, cap)
            _wait_for(lambda: "cannot accept connections" in log.read_text(), "no EMFILE")
            _until_closed(socks)
        assert _metric(port, "kelvin_flooded_http_accept_errors_total") >= 1
        text = log.read_text()
        assert "Traceback" not in text
        assert len(re.findall("cannot accept connections: EMFILE", text)) == 1, text
