"""The built-in MQTT endpoint: a purpose-built, publish-only MQTT 3.1/3.1.1/5 server.

Pushers connect here directly; there is no broker. Each connection is an
:class:`asyncio.Protocol` that parses whole socket reads at once and hands
every PUBLISH of a read to the :class:`~.ingest.Ingestor` in one call; the
PUBACK / PUBREC goes out only when the ingestor reports the group durable in
the spool. A connection never buffers more than one packet; a client that does
not CONNECT in time, goes silent past its keep-alive, or stops reading its acks
is cut off or paused without affecting the others. Subscriptions are refused
(SUBACK failure): this endpoint only ingests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import socket
import ssl
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.tasks import cancel
from services.common.logs import RateLimitedLog
from services.common.net import bind_tcp, bound_port

log = logging.getLogger(__name__)

_ACK2 = struct.Struct(">BBH")
_SESSIONS_MAX = 10_000


def encode_acks(first_byte: int, pids: list[int]) -> bytes:
    """Many 4-byte acks (PUBACK 0x40 / PUBREC 0x50) at once."""
    if len(pids) < 16:
        return b"".join([_ACK2.pack(first_byte, 2, p) for p in pids])
    n = len(pids)
    out = np.empty((n, 4), dtype=np.uint8)
    out[:, 0] = first_byte
    out[:, 1] = 2
    out[:, 2:] = np.asarray(pids, dtype=">u2").view(np.uint8).reshape(n, 2)
    return out.tobytes()


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    connect_timeout_s: float = 10.0
    max_connections: int = 10_000
    max_packet_bytes: int = 4 << 20


class MqttConnection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server: MqttServer) -> None:
        self.server = server
        self.ingestor = server.ingestor
        self.parser = mp.PacketParser(server.limits.max_packet_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.client_id = ""
        self.username: str | None = None
        self.level = 4
        self.keepalive_s = 0
        self.connected = False
        self.closed = False
        self.created = time.monotonic()
        self.connected_at_ns = 0
        self.last_rx = self.created
        self.messages = 0
        self.awaiting_rel: set[int] = set()
        self.paused_by: set[str] = set()

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=1 << 20)
        self.server.add(self)
        if self.server.paused:
            self.pause("pressure")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.remove(self, "connection_lost" if exc else "closed")

    def pause_writing(self) -> None:
        # The client does not read its acks: stop reading its publishes.
        self.pause("write")

    def resume_writing(self) -> None:
        self.resume("write")

    def pause(self, why: str) -> None:
        if not self.paused_by and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.paused_by.add(why)

    def resume(self, why: str) -> None:
        self.paused_by.discard(why)
        if not self.paused_by and self.transport is not None and not self.closed:
            self.last_rx = time.monotonic()
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()
        error: mp.ProtocolError | None = None
        try:
            packets = self.parser.feed(data)
        except mp.ProtocolError as exc:
            packets, error = exc.packets, exc
        pubs = self.handle(packets)
        if pubs:
            # Also when the connection closed after them (DISCONNECT, a protocol
            # error): what arrived before is valid; QoS 0 has no second chance.
            self.messages += len(pubs)
            self.ingestor.receive_mqtt(self, pubs, "mqtt")
        if error is not None and not self.closed:
            self.protocol_error(error)

    def handle(self, packets: list[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
        """Answer control packets; return the publishes for the ingestor."""
        pubs: list[tuple[Any, ...]] | None = None
        for p in packets:
            t = p[0]
            if (t == mp.PUBLISH or t == mp.TOO_LARGE) and self.connected:
                if p[1] == 2 and p[3] in self.awaiting_rel:
                    self.write(mp.ack(mp.PUBREC, p[3]))  # duplicate of a stored QoS 2 message
                    continue
                if pubs is None:
                    pubs = []
                pubs.append(p)
            elif not self.connected:
                if t != mp.CONNECT:
                    self.protocol_error(
                        mp.ProtocolError("first packet is not CONNECT", "protocol_error")
                    )
                    break
                if not self.on_connect(p[1]):
                    break
            else:
                self.control(p)
                if self.closed:
                    break
        return pubs

    # ------------------------------------------------------------------ packets
    def on_connect(self, c: mp.Connect) -> bool:
        self.level = c.level
        codes = mp.CONNACK_V5 if c.level == 5 else mp.CONNACK_V3
        srv = self.server
        if srv.users:
            expected = srv.users.get(c.username or "")
            if expected is None or not hmac.compare_digest(
                (c.password or b""), expected.encode("utf-8")
            ):
                srv.bad.warning(
                    "auth", "MQTT %s: bad user name or password (user %r)", self.peer, c.username
                )
                return self.refuse(codes["credentials"], "auth_failed")
        if len(srv.conns) > srv.limits.max_connections:
            return self.refuse(codes["unavailable"], "too_many_connections")
        props: dict[int, int | bytes] = {}
        client_id = c.client_id
        if not client_id:
            if not c.clean and c.level < 5:
                return self.refuse(codes["identifier"], "bad_client_id")
            client_id = f"kelvin-auto-{next(srv.ids)}"
            if c.level == 5:
                props[0x12] = client_id.encode()
        self.client_id = client_id
        self.username = c.username
        self.keepalive_s = c.keepalive_s
        present = False
        if c.clean:
            srv.sessions.pop(client_id, None)
        else:
            state = srv.sessions.get(client_id)
            present = state is not None
            self.awaiting_rel = state if state is not None else set()
            srv.sessions[client_id] = self.awaiting_rel
            srv.sessions.move_to_end(client_id)
            while len(srv.sessions) > _SESSIONS_MAX:
                srv.sessions.popitem(last=False)
        if c.level == 5:
            props.update({0x27: srv.limits.max_packet_bytes, 0x25: 0, 0x28: 0, 0x29: 0, 0x2A: 0})
        srv.take_over(self)
        self.connected = True
        self.connected_at_ns = time.time_ns()
        self.write(mp.connack(present, 0, c.level, props))
        return True

    def refuse(self, code: int, reason: str) -> bool:
        self.write(mp.connack(False, code, self.level))
        self.close(reason)
        return False

    def control(self, p: tuple[Any, ...]) -> None:
        t = p[0]
        if t == mp.PINGREQ:
            self.write(mp.PINGRESP_PACKET)
        elif t == mp.PUBREL:
            self.awaiting_rel.discard(p[1])
            self.write(mp.ack(mp.PUBCOMP, p[1]))
        elif t == mp.DISCONNECT:
            self.close("client_disconnect")
        elif t == mp.SUBSCRIBE:
            code = mp.RC_IMPLEMENTATION if self.level == 5 else 0x80
            self.write(mp.suback(p[1], [code] * len(p[2]), self.level))
        elif t == mp.UNSUBSCRIBE:
            self.write(mp.unsuback(p[1], len(p[2]), self.level))
        elif t == mp.CONNECT:
            self.protocol_error(
                mp.ProtocolError(
                    "second CONNECT on one connection", "protocol_error", mp.RC_PROTOCOL_ERROR
                )
            )
        # PUBACK / PUBREC / PUBCOMP from a client answer nothing we sent: ignore.

    def protocol_error(self, exc: mp.ProtocolError) -> None:
        self.ingestor.reject(
            None, exc.reason, f"MQTT {self.peer} ({self.client_id or 'no CONNECT'}): {exc}"
        )
        if self.connected and self.level == 5:
            self.write(mp.disconnect(exc.code))
        elif not self.connected and exc.reason == "bad_protocol":
            self.write(mp.connack(False, 0x01, 4))
        self.close(exc.reason)

    # ------------------------------------------------------------------ acks from the ingestor
    def acked(self, qos1: list[int], qos2: list[int], codes: dict[int, int]) -> None:
        if self.closed:
            return
        if codes and self.level == 5:
            parts = [mp.ack(mp.PUBACK, pid, codes.get(pid, 0)) for pid in qos1]
            parts += [mp.ack(mp.PUBREC, pid, codes.get(pid, 0)) for pid in qos2]
            self.write(b"".join(parts))
        else:
            if qos1:
                self.write(encode_acks(0x40, qos1))
            if qos2:
                self.write(encode_acks(0x50, qos2))
        if qos2:
            self.awaiting_rel.update(qos2)

    def not_durable(self) -> None:
        # Without an ack the client keeps these messages and sends them again.
        self.close("spool_failed")

    # ------------------------------------------------------------------ plumbing
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self, reason: str) -> None:
        if self.closed or self.transport is None:
            return
        self.closed = True
        self.server.remove(self, reason)
        self.transport.close()

    def info(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "address": self.peer,
            "protocol": {3: "3.1", 4: "3.1.1", 5: "5"}.get(self.level, str(self.level)),
            "username": self.username,
            "connected_at_ns": self.connected_at_ns,
            "messages": self.messages,
            "idle_s": round(time.monotonic() - self.last_rx, 3),
        }


class MqttServer:
    """Listener, connection registry, back-pressure fan-out and the timeout sweeper."""

    def __init__(
        self,
        ingestor: Ingestor,
        metrics: AgentMetrics,
        host: str,
        port: int,
        limits: EndpointLimits,
        users: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.ingestor = ingestor
        self.metrics = metrics
        self.host, self.requested_port = host, port
        self.limits = limits
        self.users = dict(users or {})
        self.ssl_context = ssl_context
        self.port: int | None = None
        self.conns: set[MqttConnection] = set()
        self.by_id: dict[str, MqttConnection] = {}
        self.sessions: OrderedDict[str, set[int]] = OrderedDict()
        self.ids = itertools.count(1)
        self.paused = False
        self.bad = RateLimitedLog(log)
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        ingestor.on_pressure.append(self._on_pressure)

    async def start(self) -> None:
        sock = bind_tcp(self.host, self.requested_port, "collect-agent MQTT", "--mqtt-port")
        self.port = bound_port(sock)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: MqttConnection(self), sock=sock, ssl=self.ssl_context
        )
        self._sweeper = asyncio.create_task(self._sweep(), name="mqtt-sweeper")

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        await cancel(self._sweeper)
        for conn in list(self.conns):
            if conn.level == 5 and conn.connected:
                conn.write(mp.disconnect(mp.RC_SERVER_SHUTTING_DOWN))
            conn.close("server_stopping")
        await self._server.wait_closed()
        self._server = None

    def add(self, conn: MqttConnection) -> None:
        self.conns.add(conn)
        self.metrics.connections.set(len(self.conns))
        self.metrics.connections_total.inc()

    def remove(self, conn: MqttConnection, reason: str) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            self.metrics.connections.set(len(self.conns))
            self.metrics.disconnects.labels(reason).inc()
        if self.by_id.get(conn.client_id) is conn:
            del self.by_id[conn.client_id]

    def take_over(self, conn: MqttConnection) -> None:
        old = self.by_id.get(conn.client_id)
        if old is not None and old is not conn:
            if old.level == 5:
                old.write(mp.disconnect(mp.RC_SESSION_TAKEN_OVER))
            old.close("session_taken_over")
        self.by_id[conn.client_id] = conn

    def _on_pressure(self, paused: bool) -> None:
        self.paused = paused
        for conn in self.conns:
            if paused:
                conn.pause("pressure")
            else:
                conn.resume("pressure")

    def clients(self) -> list[dict[str, Any]]:
        return sorted((c.info() for c in self.conns if c.connected), key=lambda d: d["client_id"])

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.limits.connect_timeout_s / 2))
            now = time.monotonic()
            for conn in list(self.conns):
                if not conn.connected:
                    if now - conn.created > self.limits.connect_timeout_s:
                        self.bad.warning(
                            "connect_timeout",
                            "MQTT %s sent no CONNECT in %.0f s",
                            conn.peer,
                            self.limits.connect_timeout_s,
                        )
                        conn.close("connect_timeout")
                elif (
                    conn.keepalive_s
                    and not conn.paused_by
                    and now - conn.last_rx > 1.5 * conn.keepalive_s
                ):
                    if conn.level == 5:
                        conn.write(mp.disconnect(mp.RC_KEEPALIVE_TIMEOUT))
                    conn.close("keepalive_timeout")
