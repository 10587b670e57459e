"""A small asyncio MQTT 5 / 3.1.1 client that publishes: what a pusher needs, nothing else.

One :class:`Connection` is one TCP (or TLS) connection to a broker: CONNECT
and CONNACK (MQTT 5 first; 3.1.1 when the broker refuses 5), PUBLISH with QoS
0 or 1, PUBACK with its MQTT 5 reason code, keep-alive (PINGREQ only when
nothing else was sent), and the broker's DISCONNECT with its reason code
(0x8B shutting down, 0x9C use another server, 0x9D server moved). It is an
``asyncio.Protocol``, not a stream: PUBLISHes queued in one loop iteration go
out in one ``write``, and acknowledgements arriving together are handled in
one wake-up. Window, resending and failover are the publisher's
(:mod:`services.pusher.publisher`); subscribing is not implemented (a pusher
never subscribes).

``aiomqtt`` over ``paho-mqtt`` costs ~4 MB of RSS, a thread-free but
callback-heavy loop and ~50 µs of CPU per PUBLISH; this costs a few µs.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
PINGREQ, PINGRESP, DISCONNECT = 12, 13, 14

RC_SERVER_SHUTTING_DOWN = 0x8B
RC_USE_ANOTHER_SERVER = 0x9C
RC_SERVER_MOVED = 0x9D
MOVE_CODES = frozenset({RC_SERVER_SHUTTING_DOWN, RC_USE_ANOTHER_SERVER, RC_SERVER_MOVED})
"""Server DISCONNECTs that mean "connect again through the same address, now"."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

# MQTT 5 property identifiers -> value kind (section 2.2.2.2 of the specification).
_PROPS = {
    0x01: "byte", 0x02: "u32", 0x03: "str", 0x08: "str", 0x09: "bin", 0x0B: "varint",
    0x11: "u32", 0x12: "str", 0x13: "u16", 0x15: "str", 0x16: "bin", 0x17: "byte",
    0x18: "u32", 0x19: "byte", 0x1A: "str", 0x1C: "str", 0x1F: "str", 0x21: "u16",
    0x22: "u16", 0x23: "u16", 0x24: "byte", 0x25: "byte", 0x26: "pair", 0x27: "u32",
    0x28: "byte", 0x29: "byte", 0x2A: "byte",
}  # fmt: skip
_CONNACK_V3 = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}
_REASONS_V5 = {
    0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error",
    0x83: "implementation specific error", 0x84: "unsupported protocol version",
    0x85: "client identifier not valid", 0x86: "bad user name or password",
    0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy", 0x8A: "banned",
    0x8B: "server shutting down", 0x8C: "bad authentication method", 0x8D: "keep alive timeout",
    0x8E: "session taken over", 0x90: "topic name invalid", 0x93: "receive maximum exceeded",
    0x95: "packet too large", 0x97: "quota exceeded", 0x99: "payload format invalid",
    0x9C: "use another server", 0x9D: "server moved", 0x9F: "connection rate exceeded",
}  # fmt: skip


def reason(code: int) -> str:
    """A reason code in words (``0x9C use another server``)."""
    return f"0x{code:02X} {_REASONS_V5.get(code, 'reason')}"


class MqttError(Exception):
    """The connection failed or was lost."""


class ConnectRefused(MqttError):
    """The broker answered CONNECT with a refusal."""

    def __init__(self, code: int, version: int) -> None:
        text = _CONNACK_V3.get(code, "refused") if version == 4 else reason(code)
        super().__init__(f"connection refused: {text}")
        self.code = code
        self.version = version

    @property
    def wants_older_protocol(self) -> bool:
        """An MQTT 3.1.1 broker's answer to an MQTT 5 CONNECT."""
        return self.version == 5 and self.code in (0x01, 0x84)


class ServerDisconnect(MqttError):
    """The broker sent DISCONNECT (MQTT 5) with a reason code."""

    def __init__(self, code: int, text: str | None = None) -> None:
        super().__init__(f"broker disconnected: {reason(code)}" + (f" ({text})" if text else ""))
        self.code = code


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return _U16.pack(len(b)) + b


def connect_packet(
    client_id: str,
    keepalive_s: int,
    version: int,
    username: str | None = None,
    password: str | None = None,
) -> bytes:
    flags = 0x02  # clean session / clean start: QoS 1 state is the publisher's, not the broker's
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = _utf8("MQTT") + bytes((version, flags)) + _U16.pack(keepalive_s)
    if version == 5:
        body += b"\x00"  # no properties: session expiry 0, the server's defaults
    body += _utf8(client_id)
    if username is not None:
        body += _utf8(username)
    if password is not None:
        body += _utf8(password)
    return bytes((CONNECT << 4,)) + varint(len(body)) + body


def publish_packet(topic: bytes, payload: bytes, qos: int, packet_id: int, version: int) -> bytes:
    """A PUBLISH (``topic`` already UTF-8); QoS 1 carries ``packet_id``."""
    head = _U16.pack(len(topic)) + topic
    if qos:
        head += _U16.pack(packet_id)
    if version == 5:
        head += b"\x00"
    return b"".join(
        (bytes(((PUBLISH << 4) | (qos << 1),)), varint(len(head) + len(payload)), head, payload)
    )


def parse_properties(data: bytes, pos: int) -> tuple[dict[int, object], int]:
    """MQTT 5 properties at ``pos``: (id -> value, position after them)."""
    length, pos = _read_varint(data, pos)
    end = pos + length
    props: dict[int, object] = {}
    while pos < end:
        pid = data[pos]
        pos += 1
        kind = _PROPS.get(pid)
        value: object
        if kind == "byte":
            value, pos = data[pos], pos + 1
        elif kind == "u16":
            value, pos = _U16.unpack_from(data, pos)[0], pos + 2
        elif kind == "u32":
            value, pos = _U32.unpack_from(data, pos)[0], pos + 4
        elif kind == "varint":
            value, pos = _read_varint(data, pos)
        elif kind in ("str", "bin"):
            (n,) = _U16.unpack_from(data, pos)
            raw = data[pos + 2 : pos + 2 + n]
            value, pos = (raw.decode("utf-8", "replace") if kind == "str" else raw), pos + 2 + n
        elif kind == "pair":
            (n,) = _U16.unpack_from(data, pos)
            pos += 2 + n
            (n,) = _U16.unpack_from(data, pos)
            pos += 2 + n
            continue
        else:
            raise MqttError(f"malformed packet: unknown property 0x{pid:02X}")
        props[pid] = value
    return props, end


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 21:
            raise MqttError("malformed packet: bad variable-length integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


@dataclass
class ConnectOptions:
    host: str
    port: int
    client_id: str
    keepalive_s: int = 30
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None
    version: int = 5
    connect_timeout_s: float = 5.0


@dataclass
class ServerLimits:
    """What the broker's CONNACK allows (MQTT 5; unlimited for 3.1.1)."""

    receive_maximum: int = 65535
    maximum_packet_size: int = 268_435_455
    keepalive_s: int | None = None
    maximum_qos: int = 2
    extra: dict[int, object] = field(default_factory=dict)


class Connection(asyncio.Protocol):
    """One connection to a broker. ``on_puback(packet_id, reason_code)`` and
    ``on_lost(exc)`` (once, with why) are called from the event loop."""

    def __init__(
        self,
        options: ConnectOptions,
        on_puback: Callable[[int, int], None],
        on_lost: Callable[[MqttError], None],
    ) -> None:
        self.o = options
        self.version = options.version
        self.on_puback = on_puback
        self.on_lost = on_lost
        self.limits = ServerLimits()
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._connack: asyncio.Future[None] | None = None
        self._closed: MqttError | None = None
        self._last_sent = 0.0
        self._last_received = 0.0
        self._ping_sent = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.keepalive_s = options.keepalive_s

    # ------------------------------------------------------------------ connect

    @classmethod
    async def open(
        cls,
        options: ConnectOptions,
        on_puback: Callable[[int, int], None],
        on_lost: Callable[[MqttError], None],
    ) -> Connection:
        """Connect, send CONNECT, wait for CONNACK; raises MqttError (ConnectRefused)."""
        loop = asyncio.get_running_loop()
        proto = cls(options, on_puback, on_lost)
        proto._connack = loop.create_future()
        try:
            async with asyncio.timeout(options.connect_timeout_s):
                await loop.create_connection(
                    lambda: proto,
                    options.host,
                    options.port,
                    ssl=options.tls,
                    server_hostname=(options.server_hostname or options.host)
                    if options.tls
                    else None,
                )
                proto._send(
                    connect_packet(
                        options.client_id,
                        options.keepalive_s,
                        options.version,
                        options.username,
                        options.password,
                    )
                )
                await proto._connack
        except TimeoutError:
            proto.close()
            raise MqttError(f"no CONNACK within {options.connect_timeout_s:g} s") from None
        except ssl.SSLError as exc:
            proto.close()
            raise MqttError(f"TLS: {exc.reason or exc}") from exc
        except OSError as exc:
            proto.close()
            raise MqttError(exc.strerror or str(exc)) from exc
        except BaseException:
            proto.close()
            raise
        proto._schedule_keepalive()
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._last_received = time.monotonic()

    def connection_lost(self, exc: Exception | None) -> None:
        why = self._closed or MqttError(
            f"connection lost: {exc}" if exc else "connection closed by the broker"
        )
        self._lose(why)

    def _lose(self, why: MqttError) -> None:
        first = self._closed is None
        self._closed = why
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._connack is not None and not self._connack.done():
            self._connack.set_exception(why)
            self._connack.exception()  # retrieved: the opener re-raises it
        elif first:
            self.on_lost(why)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # ------------------------------------------------------------------ sending

    def publish(self, topic: bytes, payload: bytes, qos: int, packet_id: int) -> None:
        """Queue a PUBLISH; everything queued in one loop iteration goes in one write."""
        self._out.append(publish_packet(topic, payload, qos, packet_id, self.version))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._send(data)

    def _send(self, data: bytes) -> None:
        if self.transport is not None and self._closed is None:
            self.transport.write(data)
            self._last_sent = time.monotonic()

    def writable_bytes(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0

    def disconnect(self) -> None:
        """A clean DISCONNECT, then close."""
        self._flush()
        self._send(bytes((DISCONNECT << 4, 0)))
        self.close()

    def close(self) -> None:
        if self._closed is None:
            self._closed = MqttError("closed by the pusher")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ keep-alive

    def _schedule_keepalive(self) -> None:
        if self.keepalive_s > 0 and self._closed is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.keepalive_s / 2, self._keepalive)

    def _keepalive(self) -> None:
        now = time.monotonic()
        if self._ping_sent and now - self._ping_sent > self.keepalive_s:
            self._lose(MqttError(f"no answer from the broker within {self.keepalive_s} s"))
            if self.transport is not None:
                self.transport.abort()
            return
        if not self._ping_sent and now - self._last_sent >= self.keepalive_s / 2:
            self._send(bytes((PINGREQ << 4, 0)))
            self._ping_sent = now
        self._schedule_keepalive()

    # ------------------------------------------------------------------ receiving

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._last_received = time.monotonic()
        buf = self._buf
        pos = 0
        try:
            while True:
                if len(buf) - pos < 2:
                    break
                length, start = _read_varint_partial(buf, pos + 1)
                if length is None or start + length > len(buf):
                    break
                self._packet(buf[pos] >> 4, bytes(buf[start : start + length]))
                pos = start + length
        except MqttError as exc:
            self._fail(exc)
            return
        if pos:
            del buf[:pos]

    def _fail(self, why: MqttError) -> None:
        self._lose(why)
        if self.transport is not None:
            self.transport.abort()

    def _packet(self, kind: int, body: bytes) -> None:
        if kind == PUBACK:
            if len(body) < 2:
                raise MqttError("malformed PUBACK")
            (pid,) = _U16.unpack_from(body, 0)
            self.on_puback(pid, body[2] if len(body) > 2 else 0)
        elif kind == PINGRESP:
            self._ping_sent = 0.0
        elif kind == CONNACK:
            self._on_connack(body)
        elif kind == DISCONNECT:
            code = body[0] if body else 0
            text: object = None
            if self.version == 5 and len(body) > 1:
                with contextlib.suppress(MqttError, struct.error, IndexError):
                    props, _ = parse_properties(body, 1)
                    text = props.get(0x1F)
            self._fail(ServerDisconnect(code, text if isinstance(text, str) else None))
        elif kind == PUBLISH:
            pass  # never subscribed; a broker has no reason to send any
        else:
            raise MqttError(f"protocol error: unexpected packet type {kind}")

    def _on_connack(self, body: bytes) -> None:
        fut = self._connack
        if fut is None or fut.done() or len(body) < 2:
            raise MqttError("protocol error: unexpected CONNACK")
        code = body[1]
        if self.version == 5 and len(body) == 2 and code in _CONNACK_V3:
            fut.set_exception(ConnectRefused(1, 5))  # a 3.1.1 broker's refusal of version 5
            return
        if code:
            fut.set_exception(ConnectRefused(code, self.version))
            return
        if self.version == 5 and len(body) > 2:
            props, _ = parse_properties(body, 2)
            limits = self.limits
            limits.extra = props
            limits.receive_maximum = int(props.get(0x21, 65535))  # type: ignore[call-overload]
            limits.maximum_packet_size = int(props.get(0x27, limits.maximum_packet_size))  # type: ignore[call-overload]
            limits.maximum_qos = int(props.get(0x24, 2))  # type: ignore[call-overload]
            if 0x13 in props:
                self.keepalive_s = int(props[0x13])  # type: ignore[call-overload]
        fut.set_result(None)


def _read_varint_partial(data: bytearray, pos: int) -> tuple[int | None, int]:
    """A remaining length at ``pos`` if complete: (value, position after), else (None, pos)."""
    value = shift = 0
    for i in range(4):
        if pos + i >= len(data):
            return None, pos
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MqttError("malformed packet: remaining length longer than 4 bytes")
