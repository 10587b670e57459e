"""One client connection of the built-in MQTT endpoint (an :class:`asyncio.Protocol`).

It parses whole socket reads at once and hands every PUBLISH of a read to the
:class:`~.ingest.Ingestor` in one call; the PUBACK / PUBREC goes out only when
the ingestor reports the group durable in the spool. Before that, each PUBLISH
of a restricted identity passes the ACL (a cached dict lookup per topic): a
denied one becomes a ``DENIED`` tuple the ingestor counts and acknowledges with
0x87 in order with the others, storing nothing. A connection never buffers more
than one packet and reserves it in the endpoint's partial-packet budget first.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from services.collect_agent import mqtt_packets as mp
from services.collect_agent.mqtt_auth import Identity
from services.collect_agent.mqtt_sessions import Session

if TYPE_CHECKING:
    from services.collect_agent.mqtt_server import MqttServer

_ACK2 = struct.Struct(">BBH")
LINGER_S = 2.0
"""How long a connection we let go may still send (dropped) before it is closed."""
_OUR_PAUSES = frozenset({"pressure", "budget", "moving"})
"""Pauses that are the server's doing: a connection is not timed out during them."""


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


class MqttConnection(asyncio.Protocol):
    """See the module docstring."""

    def __init__(self, server: MqttServer) -> None:
        self.server = server
        self.ingestor = server.ingestor
        lim = server.limits
        self.parser = mp.PacketParser(lim.max_packet_bytes, lim.connect_max_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.client_id = ""
        self.username: str | None = None
        self.identity: Identity | None = None
        self.allowed: set[bytes] | None = None
        """Topics the identity may publish (its ACL cache); None = unrestricted: no check."""
        self.session: Session | None = None
        self.level = 4
        self.keepalive_s = 0
        self.connected = False
        self.closed = False
        self.created = time.monotonic()
        self.connected_at_ns = 0
        self.connected_mono = 0.0
        self.age_jitter = random.random() * 0.1
        self.last_rx = self.created
        self.messages = 0
        self.reserved = 0
        """Bytes held for it in the partial-packet budget."""
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

    @property
    def pending_bytes(self) -> int:
        return self.parser.pending_bytes

    @property
    def buffered_bytes(self) -> int:
        return self.parser.buffered_bytes

    @property
    def stalled_inside_packet(self) -> bool:
        """Holding part of a packet and not paused by us (the sweeper times it out)."""
        return bool(self.parser.pending_bytes) and not (self.paused_by & _OUR_PAUSES)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # lingering after our DISCONNECT: dropped, the client sends it again
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
        if self.closed:
            return
        need = self.parser.pending_bytes
        if need != self.reserved:
            budget = self.server.budget
            if not budget.reserve(self, need):
                self.pause("budget")
                if not budget.wait(self):
                    self.server.bad.warning(
                        "partial_budget",
                        "MQTT %s (%s): closed: partially received packets already hold the "
                        "endpoint's budget of %d bytes (mqtt_partial_budget_bytes)",
                        self.peer, self.client_id or "no CONNECT", budget.limit,
                    )  # fmt: skip
                    self.close("partial_budget")

    def handle(self, packets: list[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
        """Answer control packets; return the publishes for the ingestor."""
        pubs: list[tuple[Any, ...]] | None = None
        for p in packets:
            t = p[0]
            if (t == mp.PUBLISH or t == mp.TOO_LARGE) and self.connected:
                if p[1] == 2 and p[3] in self.awaiting_rel:
                    self.write(mp.ack(mp.PUBREC, p[3]))  # duplicate of a stored QoS 2 message
                    continue
                allowed = self.allowed
                if allowed is not None and t == mp.PUBLISH and p[2] not in allowed:
                    assert self.identity is not None
                    denied = self.server.auth.decide(self.identity, p[2])
                    if denied is not None:
                        p = (mp.DENIED, p[1], p[2], p[3], denied, self.username)
                if pubs is None:
                    pubs = []
                pubs.append(p)
            elif not self.connected:
                if t != mp.CONNECT:
                    self.protocol_error(
                        mp.ProtocolError("first packet is not CONNECT", "protocol_error")
                    )
                    break
                if not self.server.on_connect(self, p[1]):
                    break
            else:
                self.control(p)
                if self.closed:
                    break
        return pubs

    # ------------------------------------------------------------------ packets
    def refuse(self, code: int, reason: str) -> bool:
        self.write(mp.connack(False, code, self.level))
        self.close(reason)
        return False

    def control(self, p: tuple[Any, ...]) -> None:
        t = p[0]
        if t == mp.PINGREQ:
            self.write(mp.PINGRESP_PACKET)
        elif t == mp.PUBREL:
            known = p[1] in self.awaiting_rel
            self.awaiting_rel.discard(p[1])
            code = 0 if known or self.level < 5 else mp.RC_PACKET_ID_NOT_FOUND
            self.write(mp.ack(mp.PUBCOMP, p[1], code))
        elif t == mp.DISCONNECT:
            expiry = p[2].get(0x11)
            if expiry is not None and self.session is not None:
                if self.session.expiry_s == 0 and expiry:
                    self.protocol_error(
                        mp.ProtocolError(
                            "DISCONNECT sets a session expiry after CONNECT asked for none",
                            "protocol_error",
                            mp.RC_PROTOCOL_ERROR,
                        )
                    )
                    return
                self.session.expiry_s = float(self.server.sessions.expiry(5, False, expiry)[0])
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
            # A PUBREC with a failure code ends that QoS 2 flow: no PUBREL follows.
            qos2 = [pid for pid in qos2 if pid not in codes]
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

    def disconnect(self, code: int, reason: str) -> None:
        """Close gracefully, telling an MQTT 5 client why (3.1.1 has no server DISCONNECT)."""
        if self.connected and self.level == 5:
            self.write(mp.disconnect(code))
        self.close(reason, linger=True)

    def close(self, reason: str, linger: bool = False) -> None:
        """``linger``: send FIN after what is written and drop what still arrives for a
        moment; closing with unread data would send a reset, which can destroy the acks
        and the DISCONNECT before the client reads them."""
        if self.closed or self.transport is None:
            return
        self.closed = True
        self.server.remove(self, reason)
        t = self.transport
        if linger and t.can_write_eof():
            t.write_eof()
            self.paused_by.clear()
            t.resume_reading()
            asyncio.get_running_loop().call_later(LINGER_S, t.close)
        else:
            t.close()

    def info(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "address": self.peer,
            "protocol": {3: "3.1", 4: "3.1.1", 5: "5"}.get(self.level, str(self.level)),
            "username": self.username,
            "role": self.identity.role if self.identity is not None else None,
            "connected_at_ns": self.connected_at_ns,
            "messages": self.messages,
            "idle_s": round(time.monotonic() - self.last_rx, 3),
        }
