"""Raw-socket HTTP load generator for line-protocol ``/write`` benchmarks.

The same bodies and the same client for every server (Kelvin's collect agent,
InfluxDB, VictoriaMetrics): ``readings`` lines of one field each, ``per_body``
lines per request, over ``series`` series (``node,host=nNNN,sensor=sNN
value=V T``), reading ``g`` on series ``g % series`` at ``TS0 + (g // series)``
seconds, so every reading is one stored point. Requests go over ``connections``
keep-alive connections, one outstanding request per connection (as Telegraf and
the InfluxDB clients send them); Python HTTP clients would measure themselves, so
this one pre-encodes every request and reads responses with plain sockets. Run
it in a subprocess so that it does not share a server's interpreter::

    python -m benchmarks.loadgen_http --port 8086 --path '/write?db=bench'

It prints one JSON line: requests, readings, seconds (first send to last
response), readings/s, the wall-clock start, and the count of each status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

TS0 = 1_764_500_000_000_000_000
S = 1_000_000_000
MEASUREMENT = "node"
FIELD = "value"


def series_tags(series: int) -> list[str]:
    """The tag part of each series' key: ``host=n<s // 100>,sensor=s<s % 100>``."""
    return [f"host=n{s // 100:04d},sensor=s{s % 100:02d}" for s in range(series)]


def expected(readings: int, series: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(series index, timestamp ns, value) of every reading the bodies carry."""
    g = np.arange(readings, dtype=np.int64)
    values = ((g * 7919) % 100_000) / 100  # two decimals, as sensors send them
    return g % series, TS0 + (g // series) * S, values


def bodies(readings: int, series: int, per_body: int) -> list[bytes]:
    sensor, ts, vs = expected(readings, series)
    heads = [f"{MEASUREMENT},{t} {FIELD}=" for t in series_tags(series)]
    lines = [
        f"{heads[s]}{v!r} {t}\n"
        for s, t, v in zip(sensor.tolist(), ts.tolist(), vs.tolist(), strict=True)
    ]
    return ["".join(lines[a : a + per_body]).encode() for a in range(0, readings, per_body)]


@dataclass
class _Conn:
    sock: socket.socket
    todo: list[bytes]
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    inbuf: bytes = b""
    waiting: bool = False


def _request(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def _response(buf: bytes) -> tuple[int, int] | None:
    """(status, bytes used) of the first complete response in ``buf``, or None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    length = 0
    for line in head[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
        elif k.strip().lower() == "transfer-encoding":
            raise RuntimeError("chunked responses are not expected from /write")
    used = end + 4 + length
    return (status, used) if len(buf) >= used else None


def post_all(
    port: int,
    path: str,
    payloads: list[bytes],
    connections: int = 4,
    headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> dict[str, object]:
    """POST every payload, round-robin over ``connections``; return when all answered."""
    hdrs = headers or {}
    requests = [_request(f"{host}:{port}", path, b, hdrs) for b in payloads]
    conns = []
    for c in range(connections):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conns.append(_Conn(sock, requests[c::connections][::-1]))
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_WRITE, c)
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    done = 0
    t0 = time.perf_counter()
    start_wall = time.time()
    while done < len(requests):
        events = sel.select(timeout=60)
        if not events:
            raise RuntimeError(f"no response for 60 s ({done} of {len(requests)} answered)")
        for key, mask in events:
            c = key.data
            if mask & selectors.EVENT_WRITE:
                if not c.out and not c.waiting and c.todo:
                    c.out = memoryview(c.todo.pop())
                with contextlib.suppress(BlockingIOError):
                    c.out = c.out[c.sock.send(c.out) :]
                if not c.out:
                    c.waiting = True
            if mask & selectors.EVENT_READ:
                data = c.sock.recv(1 << 16)
                if not data:
                    raise RuntimeError("server closed the connection")
                c.inbuf += data
                got = _response(c.inbuf)
                if got is not None:
                    status, used = got
                    statuses[status] += 1
                    if status >= 300 and len(errors) < 3:
                        errors.append(c.inbuf[:used].decode("latin-1")[-300:])
                    c.inbuf = c.inbuf[used:]
                    c.waiting = False
                    done += 1
                    if c.todo:
                        c.out = memoryview(c.todo.pop())
            want = selectors.EVENT_READ if c.waiting else 0
            if c.out or (not c.waiting and c.todo):
                want |= selectors.EVENT_WRITE
            if want:
                sel.modify(c.sock, want, c)
            else:
                sel.unregister(c.sock)
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.sock.close()
    return {
        "requests": len(requests),
        "seconds": elapsed,
        "start": start_wall,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loadgen_http")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/write")
    ap.add_argument("--readings", type=int, default=1_000_000)
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--per-body", type=int, default=1_000)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--header", action="append", default=[], help="'Name: value'")
    a = ap.parse_args(argv)
    headers = dict(h.split(": ", 1) for h in a.header)
    payloads = bodies(a.readings, a.series, a.per_body)
    result = post_all(a.port, a.path, payloads, a.connections, headers)
    result["readings"] = a.readings
    result["rate"] = a.readings / float(result["seconds"])  # type: ignore[arg-type]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
