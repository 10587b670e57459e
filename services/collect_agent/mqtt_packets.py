"""MQTT 3.1, 3.1.1 and 5 packets for a publish-only server: an incremental parser and encoders.

The parser turns a byte stream into packet tuples without per-byte Python
loops; a PUBLISH costs a few slices. It never buffers more than one packet
(bounded by ``max_packet_bytes``): an oversized PUBLISH is reported with its
topic and packet id and the rest of it is skipped, so the connection survives.
Anything that breaks framing raises :class:`ProtocolError` (the connection
must close, as the MQTT specification demands).

Packet tuples (first element = packet type):

* ``(PUBLISH, qos, topic: bytes, packet_id, payload: bytes)``
* ``(TOO_LARGE, qos, topic: bytes, packet_id, size)``
* ``(DENIED, qos, topic: bytes, packet_id, reason, user)``: made by the endpoint
  from a PUBLISH its ACL refuses (never stored, acknowledged with 0x87)
* ``(CONNECT, Connect)``
* ``(PUBACK|PUBREC|PUBREL|PUBCOMP, packet_id)``
* ``(SUBSCRIBE|UNSUBSCRIBE, packet_id, [topic filter bytes, ...])``
* ``(PINGREQ,)``, ``(DISCONNECT, reason_code, properties)``
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
AUTH = 15
TOO_LARGE = -3
DENIED = -4

# CONNACK return codes, 3.1.1 / 5
CONNACK_V3 = {
    "ok": 0,
    "protocol": 1,
    "identifier": 2,
    "unavailable": 3,
    "credentials": 4,
    "not_authorized": 5,
}
CONNACK_V5 = {
    "ok": 0,
    "protocol": 0x84,
    "identifier": 0x85,
    "unavailable": 0x88,
    "credentials": 0x86,
    "not_authorized": 0x87,
}

# MQTT 5 reason codes the server sends
RC_SUCCESS = 0x00
RC_UNSPECIFIED = 0x80
RC_MALFORMED = 0x81
RC_PROTOCOL_ERROR = 0x82
RC_IMPLEMENTATION = 0x83
RC_NOT_AUTHORIZED = 0x87
RC_KEEPALIVE_TIMEOUT = 0x8D
RC_SESSION_TAKEN_OVER = 0x8E
RC_TOPIC_INVALID = 0x90
RC_PACKET_ID_NOT_FOUND = 0x92
RC_PACKET_TOO_LARGE = 0x95
RC_QUOTA_EXCEEDED = 0x97
RC_PAYLOAD_INVALID = 0x99
RC_SERVER_SHUTTING_DOWN = 0x8B
RC_USE_ANOTHER_SERVER = 0x9C
RC_SERVER_MOVED = 0x9D

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class ProtocolError(Exception):
    """The stream breaks MQTT framing; ``reason`` labels the close, ``code`` is the v5 code."""

    def __init__(self, message: str, reason: str = "malformed_packet", code: int = RC_MALFORMED):
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.packets: list[tuple[Any, ...]] = []
        """Whole packets parsed before the error (they are valid and still count)."""


@dataclass(slots=True)
class Connect:
    """What a CONNECT carried."""

    level: int
    """Protocol level: 3 (3.1), 4 (3.1.1) or 5."""
    clean: bool
    keepalive_s: int
    client_id: str
    username: str | None = None
    password: bytes | None = None
    will: bool = False
    properties: dict[int, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- decoding helpers


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Variable byte integer at ``pos``; raises ProtocolError if it is cut or too long."""
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= end:
            raise ProtocolError("variable-length integer runs past the packet")
        b = data[pos + i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + i + 1
        shift += 7
    raise ProtocolError("variable-length integer longer than 4 bytes")


def _u16(data: bytes, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise ProtocolError(f"packet ends inside its {what}")
    return (data[pos] << 8) | data[pos + 1]


def _string(data: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    n = _u16(data, pos, end, what + " length")
    if pos + 2 + n > end:
        raise ProtocolError(f"{what} of {n} bytes runs past the packet")
    return data[pos + 2 : pos + 2 + n], pos + 2 + n


def _utf8(raw: bytes, what: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not valid UTF-8", "bad_utf8") from exc
    if "\x00" in text:
        raise ProtocolError(f"{what} contains a NUL character", "bad_utf8")
    return text


_PROP_BYTE = {0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A}
_PROP_U16 = {0x13, 0x21, 0x22, 0x23}
_PROP_U32 = {0x02, 0x11, 0x18, 0x27}
_PROP_STR = {0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F}
_PROP_BIN = {0x09, 0x16}


def parse_properties(data: bytes, pos: int, end: int) -> tuple[dict[int, Any], int]:
    """MQTT 5 properties at ``pos``: {id: value}; user properties (0x26) as a list of pairs."""
    length, pos = _varint(data, pos, end)
    stop = pos + length
    if stop > end:
        raise ProtocolError(f"properties of {length} bytes run past the packet")
    props: dict[int, Any] = {}
    while pos < stop:
        pid, pos = _varint(data, pos, stop)
        if pid in _PROP_BYTE:
            if pos >= stop:
                raise ProtocolError(f"property 0x{pid:02x} is cut")
            props[pid] = data[pos]
            pos += 1
        elif pid in _PROP_U16:
            props[pid] = _u16(data, pos, stop, f"property 0x{pid:02x}")
            pos += 2
        elif pid in _PROP_U32:
            if pos + 4 > stop:
                raise ProtocolError(f"property 0x{pid:02x} is cut")
            props[pid] = _U32.unpack_from(data, pos)[0]
            pos += 4
        elif pid == 0x0B:
            props[pid], pos = _varint(data, pos, stop)
        elif pid in _PROP_STR or pid in _PROP_BIN:
            props[pid], pos = _string(data, pos, stop, f"property 0x{pid:02x}")
        elif pid == 0x26:
            k, pos = _string(data, pos, stop, "user property name")
            v, pos = _string(data, pos, stop, "user property value")
            props.setdefault(pid, []).append((k, v))
        else:
            raise ProtocolError(f"unknown property identifier 0x{pid:02x}")
    return props, stop


def parse_connect(data: bytes, pos: int, end: int) -> Connect:
    """The body of a CONNECT packet (``data[pos:end]``)."""
    name, pos = _string(data, pos, end, "protocol name")
    if pos + 4 > end:
        raise ProtocolError("CONNECT ends inside its variable header")
    level, flags = data[pos], data[pos + 1]
    keepalive = (data[pos + 2] << 8) | data[pos + 3]
    pos += 4
    if (name, level) not in ((b"MQTT", 4), (b"MQTT", 5), (b"MQIsdp", 3)):
        raise ProtocolError(
            f"unsupported protocol {name[:16]!r} level {level}; expected MQTT 3.1, 3.1.1 or 5",
            "bad_protocol",
            0x84,
        )
    if flags & 0x01:
        raise ProtocolError("CONNECT reserved flag is set")
    props: dict[int, Any] = {}
    if level == 5:
        props, pos = parse_properties(data, pos, end)
    raw_id, pos = _string(data, pos, end, "client identifier")
    will = bool(flags & 0x04)
    if will:
        if level == 5:
            _, pos = parse_properties(data, pos, end)
        _, pos = _string(data, pos, end, "will topic")
        _, pos = _string(data, pos, end, "will message")
    elif flags & 0x38:
        raise ProtocolError("will QoS/retain set without the will flag")
    username = password = None
    if flags & 0x80:
        raw_user, pos = _string(data, pos, end, "user name")
        username = _utf8(raw_user, "user name")
    if flags & 0x40:
        password, pos = _string(data, pos, end, "password")
    if pos != end:
        raise ProtocolError(f"CONNECT has {end - pos} unexpected trailing bytes")
    return Connect(
        level=level,
        clean=bool(flags & 0x02),
        keepalive_s=keepalive,
        client_id=_utf8(raw_id, "client identifier"),
        username=username,
        password=password,
        will=will,
        properties=props,
    )


def _filters(data: bytes, pos: int, end: int, with_options: bool) -> list[bytes]:
    out: list[bytes] = []
    while pos < end:
        f, pos = _string(data, pos, end, "topic filter")
        if with_options:
            if pos >= end:
                raise ProtocolError("SUBSCRIBE ends before a subscription option byte")
            pos += 1
        out.append(f)
    if not out:
        raise ProtocolError("SUBSCRIBE/UNSUBSCRIBE without a topic filter", "protocol_error")
    return out


# --------------------------------------------------------------------------- the parser


class PacketParser:
    """Incremental MQTT parser for one connection (see the module docstring)."""

    __slots__ = ("_after_connect", "_have", "_need", "_parts", "_skip", "level", "max_packet_bytes")

    def __init__(
        self, max_packet_bytes: int = 4 << 20, first_packet_max: int | None = None
    ) -> None:
        """``first_packet_max``: limit until a CONNECT is parsed (nothing big is buffered
        for a client that has not presented credentials); None = ``max_packet_bytes``."""
        self.max_packet_bytes = max_packet_bytes if first_packet_max is None else first_packet_max
        self._after_connect = max_packet_bytes
        self.level = 4
        """Protocol level; set by the CONNECT the parser sees (PUBLISH differs in v5)."""
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0
        self._skip = 0

    @property
    def buffered_bytes(self) -> int:
        return self._have

    @property
    def pending_bytes(self) -> int:
        """Total size of the packet being received (0 when between packets)."""
        return self._need if self._parts else 0

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """Parse as many whole packets as ``data`` completes; keep the rest.

        Raises ProtocolError (with the packets parsed before the error attached)
        when the stream breaks MQTT framing; the parser is then unusable.
        """
        out: list[tuple[Any, ...]] = []
        try:
            return self._feed(data, out)
        except ProtocolError as exc:
            exc.packets = out
            raise

    def _feed(self, data: bytes, out: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return []
            data = data[self._skip :]
            self._skip = 0
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(self._parts)
            self._parts = []
            self._have = 0
        n = len(data)
        pos = 0
        limit = self.max_packet_bytes
        head_wait = False
        while n - pos >= 2:
            b0 = data[pos]
            rl = data[pos + 1]
            hdr = 2
            if rl & 0x80:
                rl &= 0x7F
                shift = 7
                while True:
                    if pos + hdr >= n:
                        if hdr >= 5:
                            raise ProtocolError("remaining length longer than 4 bytes")
                        rl = -1
                        break
                    b = data[pos + hdr]
                    hdr += 1
                    rl |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    if hdr >= 5:
                        raise ProtocolError("remaining length longer than 4 bytes")
                    shift += 7
                if rl < 0:
                    break  # header incomplete
            start = pos + hdr
            end = start + rl
            ptype = b0 >> 4
            if rl + hdr > limit:
                consumed = self._oversized(data, pos, start, end, n, b0, rl + hdr, out)
                if consumed < 0:
                    head_wait = True  # need more of its head; never buffer its body
                    break
                pos = consumed
                continue
            if end > n:
                break
            if ptype == PUBLISH:
                qos = (b0 >> 1) & 3
                if rl < 2:
                    raise ProtocolError("PUBLISH shorter than its topic length")
                tl = (data[start] << 8) | data[start + 1]
                p = start + 2 + tl
                if qos:
                    if qos == 3:
                        raise ProtocolError("PUBLISH with QoS 3")
                    if p + 2 > end:
                        raise ProtocolError("PUBLISH ends inside its topic or packet id")
                    pid = (data[p] << 8) | data[p + 1]
                    if pid == 0:
                        raise ProtocolError("PUBLISH QoS>0 with packet identifier 0")
                    p += 2
                else:
                    if p > end:
                        raise ProtocolError("PUBLISH topic runs past the packet")
                    pid = 0
                if self.level == 5:
                    props, p = parse_properties(data, p, end)
                    if 0x23 in props:
                        raise ProtocolError(
                            "topic alias used although the server allows none",
                            "protocol_error",
                            0x94,
                        )
                out.append((PUBLISH, qos, data[start + 2 : start + 2 + tl], pid, data[p:end]))
            else:
                out.append(self._control(ptype, b0 & 0x0F, data, start, end))
                if ptype == CONNECT:
                    limit = self.max_packet_bytes
            pos = end
        if pos < n:
            rest = data[pos:] if pos else data
            self._parts = [rest]
            self._have = len(rest)
            self._need = len(rest) + 1 if head_wait else self._needed(rest)
        else:
            self._need = 0
        return out

    @staticmethod
    def _needed(rest: bytes) -> int:
        """Bytes the pending packet needs in total (or one more when its header is cut)."""
        n = len(rest)
        rl, shift, i = 0, 0, 1
        while i < n and i < 5:
            b = rest[i]
            rl |= (b & 0x7F) << shift
            if b < 0x80:
                return i + 1 + rl
            shift += 7
            i += 1
        return n + 1

    def _oversized(
        self,
        data: bytes,
        pos: int,
        start: int,
        end: int,
        n: int,
        b0: int,
        size: int,
        out: list[tuple[Any, ...]],
    ) -> int:
        """Report an oversized PUBLISH by its head and skip its body; -1 = head incomplete."""
        if b0 >> 4 != PUBLISH:
            raise ProtocolError(
                f"packet type {b0 >> 4} of {size} bytes exceeds the limit of "
                f"{self.max_packet_bytes} bytes",
                "too_large",
                RC_PACKET_TOO_LARGE,
            )
        qos = (b0 >> 1) & 3
        if qos == 3:
            raise ProtocolError("PUBLISH with QoS 3")
        if start + 2 > n:
            return -1
        tl = (data[start] << 8) | data[start + 1]
        head = 2 + tl + (2 if qos else 0)
        if start + head > n:
            if head > self.max_packet_bytes:
                raise ProtocolError("PUBLISH topic longer than the packet limit", "too_large")
            return -1
        pid = (data[start + 2 + tl] << 8) | data[start + 3 + tl] if qos else 0
        out.append((TOO_LARGE, qos, data[start + 2 : start + 2 + tl], pid, size))
        if end <= n:
            return end
        self._skip = end - n
        return n

    def _control(
        self, ptype: int, flags: int, data: bytes, start: int, end: int
    ) -> tuple[Any, ...]:
        rl = end - start
        if ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            if ptype == PUBREL and flags != 2:
                raise ProtocolError("PUBREL flags must be 0b0010")
            if rl < 2:
                raise ProtocolError(f"packet type {ptype} shorter than its packet id")
            return (ptype, (data[start] << 8) | data[start + 1])
        if ptype == PINGREQ:
            return (PINGREQ,)
        if ptype == DISCONNECT:
            props: dict[int, Any] = {}
            if self.level == 5 and rl >= 2:
                props, _ = parse_properties(data, start + 1, end)
            return (DISCONNECT, data[start] if rl >= 1 else 0, props)
        if ptype in (SUBSCRIBE, UNSUBSCRIBE):
            if flags != 2:
                raise ProtocolError("SUBSCRIBE/UNSUBSCRIBE flags must be 0b0010")
            pid = _u16(data, start, end, "packet id")
            p = start + 2
            if self.level == 5:
                _, p = parse_properties(data, p, end)
            return (ptype, pid, _filters(data, p, end, ptype == SUBSCRIBE))
        if ptype == CONNECT:
            conn = parse_connect(data, start, end)
            self.level = conn.level
            self.max_packet_bytes = self._after_connect
            return (CONNECT, conn)
        raise ProtocolError(
            f"packet type {ptype} is not one a client sends to a server", "protocol_error", 0x82
        )


# --------------------------------------------------------------------------- encoders


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _props(props: dict[int, int | bytes]) -> bytes:
    body = bytearray()
    for pid, v in props.items():
        body.append(pid)
        if isinstance(v, bytes):
            body += _U16.pack(len(v)) + v
        elif pid in _PROP_BYTE:
            body.append(v)
        elif pid in _PROP_U16:
            body += _U16.pack(v)
        else:
            body += _U32.pack(v)
    return _varint_bytes(len(body)) + bytes(body)


def connack(
    session_present: bool, code: int, level: int, props: dict[int, int | bytes] | None = None
) -> bytes:
    body = bytes((1 if session_present else 0, code))
    if level == 5:
        body += _props(props or {})
    return bytes((CONNACK << 4,)) + _varint_bytes(len(body)) + body


def ack(ptype: int, pid: int, code: int = 0) -> bytes:
    """PUBACK / PUBREC / PUBCOMP (/ PUBREL); a v5 reason code is appended when not 0."""
    first = (ptype << 4) | (2 if ptype == PUBREL else 0)
    if code:
        return bytes((first, 3, pid >> 8, pid & 0xFF, code))
    return bytes((first, 2, pid >> 8, pid & 0xFF))


def suback(pid: int, codes: list[int], level: int) -> bytes:
    body = _U16.pack(pid) + (b"\x00" if level == 5 else b"") + bytes(codes)
    return bytes((SUBACK << 4,)) + _varint_bytes(len(body)) + body


def unsuback(pid: int, count: int, level: int) -> bytes:
    body = _U16.pack(pid) + (b"\x00" + bytes([0x11] * count) if level == 5 else b"")
    return bytes((UNSUBACK << 4,)) + _varint_bytes(len(body)) + body


PINGRESP_PACKET = bytes((PINGRESP << 4, 0))


def disconnect(code: int) -> bytes:
    """A v5 server DISCONNECT with a reason code (3.1.1 has none: just close)."""
    return bytes((DISCONNECT << 4, 1, code))


def publish(
    topic: str | bytes, payload: bytes, qos: int = 0, pid: int = 0, level: int = 4
) -> bytes:
    """Encode a client PUBLISH (load generators and tests)."""
    t = topic.encode() if isinstance(topic, str) else topic
    var = (
        _U16.pack(len(t)) + t + (_U16.pack(pid) if qos else b"") + (b"\x00" if level == 5 else b"")
    )
    body = var + payload
    return bytes(((PUBLISH << 4) | (qos << 1),)) + _varint_bytes(len(body)) + body


def connect(
    client_id: str,
    level: int = 4,
    clean: bool = True,
    keepalive_s: int = 60,
    username: str | None = None,
    password: str | None = None,
    properties: dict[int, int | bytes] | None = None,
) -> bytes:
    """Encode a client CONNECT (load generators and tests); ``properties`` for v5."""
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0)
    flags |= 0x40 if password is not None else 0
    name = b"MQIsdp" if level == 3 else b"MQTT"
    var = _U16.pack(len(name)) + name + bytes((level, flags)) + _U16.pack(keepalive_s)
    if level == 5:
        var += _props(properties or {})
    cid = client_id.encode()
    body = var + _U16.pack(len(cid)) + cid
    if username is not None:
        body += _U16.pack(len(username.encode())) + username.encode()
    if password is not None:
        body += _U16.pack(len(password.encode())) + password.encode()
    return bytes((CONNECT << 4,)) + _varint_bytes(len(body)) + body
