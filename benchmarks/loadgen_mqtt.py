"""Raw-socket MQTT load generator and counting subscriber for the collect-agent benchmark.

Python MQTT clients manage 10-40k messages/s here (``measured-here.md``), too few
to load an agent, so this publisher sends pre-encoded PUBLISH packets in 64 KiB
writes over plain sockets with a window of unacknowledged messages per
connection, and counts PUBACK bytes instead of parsing them. Run it in a
subprocess so that it does not share the agent's interpreter::

    python -m benchmarks.loadgen_mqtt publish --port 1883 --messages 200000 --readings 1
    python -m benchmarks.loadgen_mqtt publish --port 1883 --messages 200000 --password TOKEN
    python -m benchmarks.loadgen_mqtt subscribe --port 1883 --expect 200000
    python -m benchmarks.loadgen_mqtt amqtt-broker --port 1883

Each prints one JSON line: messages, seconds, messages/s (first send to last ack);
the subscriber first prints ``{"subscribed": true}`` once its subscription is active.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from services.collect_agent import mqtt_packets as mp

TS0 = 1_764_500_000_000_000_000
_CHUNK = 64 << 10


def dcdb_packets(
    messages: int, readings: int, sensors: int, qos: int = 1, ts0: int = TS0
) -> list[bytes]:
    """PUBLISH packets of DCDB records: message i goes to sensor i % sensors, with
    timestamps unique per sensor so that every reading is one stored row."""
    rec = struct.Struct("<qQ")
    topics = [f"/bench/n{s // 100:03d}/s{s % 100:02d}" for s in range(sensors)]
    out = []
    for i in range(messages):
        sensor, rnd = i % sensors, i // sensors
        base = ts0 + rnd * readings * 1000
        payload = b"".join(rec.pack(i + k, base + k * 1000) for k in range(readings))
        out.append(mp.publish(topics[sensor], payload, qos, (i % 65535) + 1))
    return out


@dataclass
class _Conn:
    sock: socket.socket
    chunks: deque[tuple[bytes, int]]
    buf: memoryview = field(default_factory=lambda: memoryview(b""))
    buf_msgs: int = 0
    sent: int = 0
    ack_bytes: int = 0


@dataclass(frozen=True)
class Login:
    """An MQTT login; a collect agent takes Kelvin's write or admin token as the password."""

    username: str | None = None
    password: str | None = None


def _connect(
    port: int, client_id: str, host: str = "127.0.0.1", login: Login = Login()
) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    user = login.username if login.username or login.password is None else "loadgen"
    sock.sendall(mp.connect(client_id, keepalive_s=600, username=user, password=login.password))
    head = sock.recv(4)
    if len(head) < 4 or head[0] != 0x20 or head[3] != 0:
        raise RuntimeError(f"CONNECT refused: {head!r}")
    return sock


def publish(
    port: int,
    packets: list[bytes],
    connections: int = 4,
    window: int = 20_000,
    qos: int = 1,
    login: Login = Login(),
) -> dict[str, float]:
    """Send ``packets`` round-robin over ``connections``; return when every one is acked."""
    conns = []
    for c in range(connections):
        mine = packets[c::connections]
        chunks: deque[tuple[bytes, int]] = deque()
        part: list[bytes] = []
        size = 0
        for p in mine:
            part.append(p)
            size += len(p)
            if size >= _CHUNK:
                chunks.append((b"".join(part), len(part)))
                part, size = [], 0
        if part:
            chunks.append((b"".join(part), len(part)))
        client_id = f"loadgen-{c}-{time.monotonic_ns()}"
        conns.append(_Conn(_connect(port, client_id, login=login), chunks))
    sel = selectors.DefaultSelector()
    for c in conns:
        c.sock.setblocking(False)
        sel.register(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
    total = len(packets)
    acked = 0
    t0 = time.perf_counter()
    start_wall = time.time()
    while (acked < total) if qos else any(c.chunks or c.buf for c in conns):
        for key, mask in sel.select(timeout=30):
            c = key.data
            if mask & selectors.EVENT_READ:
                data = c.sock.recv(1 << 20)
                if not data:
                    raise RuntimeError("server closed the connection")
                c.ack_bytes += len(data)
                acked = sum(x.ack_bytes for x in conns) // 4
            if mask & selectors.EVENT_WRITE:
                while True:
                    if not c.buf:
                        if not c.chunks or c.sent - c.ack_bytes // 4 >= window:
                            break
                        data, n = c.chunks.popleft()
                        c.buf, c.sent = memoryview(data), c.sent + n
                    try:
                        written = c.sock.send(c.buf)
                    except BlockingIOError:
                        break
                    c.buf = c.buf[written:]
        for c in conns:
            want = selectors.EVENT_READ
            if c.buf or (c.chunks and c.sent - c.ack_bytes // 4 < window):
                want |= selectors.EVENT_WRITE
            sel.modify(c.sock, want, c)
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.sock.setblocking(True)
        c.sock.sendall(b"\xe0\x00")
        c.sock.close()
    return {"messages": total, "seconds": elapsed, "rate": total / elapsed, "start": start_wall}


def subscribe_count(port: int, expect: int, topic: str = "/bench/#") -> dict[str, float]:
    """Subscribe at QoS 1 and count PUBLISHes (acking each) until ``expect`` arrived."""
    sock = _connect(port, f"counter-{time.monotonic_ns()}")
    t = topic.encode()
    body = struct.pack(">H", 1) + struct.pack(">H", len(t)) + t + b"\x01"
    sock.sendall(bytes((0x82, len(body))) + body)
    suback = sock.recv(5)
    if len(suback) < 5 or suback[0] != 0x90 or suback[4] > 2:
        raise RuntimeError(f"SUBSCRIBE refused: {suback!r}")
    print(json.dumps({"subscribed": True}), flush=True)  # the caller starts publishing now
    count = 0
    buf = b""
    t0: float | None = None
    while count < expect:
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("broker closed the connection")
        if t0 is None:
            t0 = time.perf_counter()
        buf = buf + data if buf else data
        pos, n, pids = 0, len(buf), []
        while n - pos >= 2:
            rl, hdr, shift = 0, 1, 0
            while pos + hdr < n:
                b = buf[pos + hdr]
                rl |= (b & 0x7F) << shift
                hdr += 1
                if b < 0x80:
                    break
                shift += 7
            else:
                break
            end = pos + hdr + rl
            if end > n:
                break
            b0 = buf[pos]
            if b0 >> 4 == 3:
                count += 1
                if b0 & 0x06:
                    p = pos + hdr
                    tl = (buf[p] << 8) | buf[p + 1]
                    pids.append((buf[p + 2 + tl] << 8) | buf[p + 3 + tl])
            pos = end
        buf = buf[pos:]
        if pids:
            sock.sendall(b"".join(struct.pack(">BBH", 0x40, 2, p) for p in pids))
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    end_wall = time.time()
    sock.close()
    return {
        "messages": count,
        "seconds": elapsed,
        "rate": count / max(elapsed, 1e-9),
        "end": end_wall,
    }


def amqtt_broker(port: int) -> None:
    """Run amqtt's broker (the reference for the built-in endpoint) until killed."""
    import asyncio

    from amqtt.broker import Broker

    async def serve() -> None:
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            # only what a collect agent would need: no event/packet logging, no $SYS
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        broker = Broker(config)
        await broker.start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loadgen_mqtt")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--messages", type=int, required=True)
    p.add_argument("--readings", type=int, default=1)
    p.add_argument("--sensors", type=int, default=1000)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--window", type=int, default=20_000)
    p.add_argument("--qos", type=int, default=1)
    p.add_argument("--ts0", type=int, default=TS0)
    p.add_argument("--username", help="MQTT user name (default loadgen when --password is set)")
    p.add_argument("--password", help="MQTT password (a collect agent: its write token)")
    s = sub.add_parser("subscribe")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--expect", type=int, required=True)
    s.add_argument("--topic", default="/bench/#")
    b = sub.add_parser("amqtt-broker")
    b.add_argument("--port", type=int, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "amqtt-broker":
        amqtt_broker(a.port)
        return 0
    if a.cmd == "publish":
        packets = dcdb_packets(a.messages, a.readings, a.sensors, a.qos, a.ts0)
        login = Login(a.username, a.password)
        result = publish(a.port, packets, a.connections, a.window, a.qos, login)
    else:
        result = subscribe_count(a.port, a.expect, a.topic)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
