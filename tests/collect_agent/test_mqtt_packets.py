"""The MQTT packet parser: exact framing across arbitrary splits, limits, and fuzzing.

Fuzzing contract: whatever bytes arrive, in whatever pieces, ``feed`` returns
packets or raises ProtocolError; it never buffers more than one packet's worth
(bounded by the limit) and never raises anything else.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collect_agent import mqtt_packets as mp

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = 4096


def feed_all(parser: mp.PacketParser, data: bytes, cuts: list[int]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    pos = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        out += parser.feed(data[pos:cut])
        pos = cut
        assert parser.buffered_bytes <= LIMIT + 5
    return out


def test_connect_v3_v311_v5_with_credentials() -> None:
    for level in (3, 4, 5):
        p = mp.PacketParser()
        [(t, c)] = p.feed(
            mp.connect("node1", level=level, keepalive_s=30, username="u", password="pw")
        )
        assert t == mp.CONNECT and isinstance(c, mp.Connect)
        assert (c.level, c.client_id, c.keepalive_s, c.username, c.password, c.clean) == (
            level, "node1", 30, "u", b"pw", True,
        )  # fmt: skip
        assert p.level == level


def test_publish_v5_properties_are_skipped() -> None:
    p = mp.PacketParser()
    p.feed(mp.connect("x", level=5))
    props = b"\x05\x01\x01\x02\x00\x00"  # payload format indicator, message expiry (cut short)
    body = b"\x00\x02/a" + b"\x00\x07" + b"\x07\x01\x01\x02\x00\x00\x00\x05" + b"data"
    [pkt] = p.feed(bytes((0x32, len(body))) + body)
    assert pkt == (mp.PUBLISH, 1, b"/a", 7, b"data")
    with pytest.raises(mp.ProtocolError):
        p.feed(bytes((0x32, 9)) + b"\x00\x02/a\x00\x07" + props[:3])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x36\x05\x00\x01/\x00\x01", "malformed_packet"),  # QoS 3
        (b"\x32\x05\x00\x01/\x00\x00", "malformed_packet"),  # packet id 0
        (b"\x30\x01\x00", "malformed_packet"),  # topic length cut
        (b"\x60\x02\x00\x01", "malformed_packet"),  # PUBREL with wrong flags
        (b"\x20\x02\x00\x00", "protocol_error"),  # CONNACK from a client
        (b"\x10\x04\x00\x03MQ", "malformed_packet"),  # CONNECT cut short
        (b"\x80\x02\x00\x01", "malformed_packet"),  # SUBSCRIBE with wrong flags
        (b"\x82\x02\x00\x01", "protocol_error"),  # SUBSCRIBE without filters
    ],
)
def test_framing_errors(data: bytes, reason: str) -> None:
    with pytest.raises(mp.ProtocolError) as exc:
        mp.PacketParser().feed(data)
    assert exc.value.reason == reason


def test_packets_before_an_error_are_kept() -> None:
    good = mp.publish("/a", b"x" * 16, 1, 1)
    with pytest.raises(mp.ProtocolError) as exc:
        mp.PacketParser().feed(good + b"\x36\x00")
    assert exc.value.packets == [(mp.PUBLISH, 1, b"/a", 1, b"x" * 16)]


def test_oversized_publish_reported_by_head_and_skipped_in_pieces() -> None:
    p = mp.PacketParser(LIMIT)
    big = mp.publish("/big", b"y" * 100_000, 1, 9)
    nxt = mp.publish("/ok", b"z" * 16, 1, 10)
    got = feed_all(p, big + nxt, list(range(0, len(big), 999)))
    assert got == [(mp.TOO_LARGE, 1, b"/big", 9, len(big)), (mp.PUBLISH, 1, b"/ok", 10, b"z" * 16)]
    with pytest.raises(mp.ProtocolError) as exc:
        mp.PacketParser(LIMIT).feed(b"\xc0" + bytes((0x80, 0x80, 0x01)))  # 16 KiB PINGREQ
    assert exc.value.reason == "too_large"


# --------------------------------------------------------------------------- fuzzing

_packet = st.one_of(
    st.builds(
        lambda t, pl, q, pid: mp.publish(t, pl, q, pid),
        st.binary(min_size=0, max_size=30),
        st.binary(max_size=300),
        st.integers(0, 2),
        st.integers(1, 65535),
    ),
    st.just(bytes((mp.PINGREQ << 4, 0))),
    st.integers(1, 65535).map(lambda pid: mp.ack(mp.PUBREL, pid)),
    st.integers(1, 65535).map(lambda pid: bytes((0x82, 7, pid >> 8, pid & 255, 0, 2, 47, 35, 1))),
)


def _expected(packet: bytes) -> tuple[Any, ...]:
    return mp.PacketParser(10**9).feed(packet)[0]


@FUZZ
@given(packets=st.lists(_packet, max_size=12), cuts=st.lists(st.integers(0, 10**6), max_size=8))
def test_fuzz_valid_streams_parse_identically_whatever_the_splits(
    packets: list[bytes], cuts: list[int]
) -> None:
    p = mp.PacketParser(LIMIT)
    got = feed_all(p, b"".join(packets), cuts)
    assert got == [_expected(x) for x in packets]
    assert p.buffered_bytes == 0


@FUZZ
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 10**6), max_size=6))
def test_fuzz_random_bytes_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    p = mp.PacketParser(LIMIT)
    p.level = 5 if data[:1] == b"\x05" else 4
    try:
        for pkt in feed_all(p, data, cuts):
            assert isinstance(pkt, tuple) and isinstance(pkt[0], int)
    except mp.ProtocolError as exc:
        assert exc.reason and str(exc)


@FUZZ
@given(
    packets=st.lists(_packet, min_size=1, max_size=6),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    level=st.sampled_from([4, 5]),
)
def test_fuzz_mutated_streams_only_protocol_errors(
    packets: list[bytes], flips: list[tuple[int, int]], level: int
) -> None:
    data = bytearray(mp.connect("f", level=level) + b"".join(packets))
    for pos, val in flips:
        data[pos % len(data)] = val
    p = mp.PacketParser(LIMIT)
    with contextlib.suppress(mp.ProtocolError):
        p.feed(bytes(data))
    assert p.buffered_bytes <= LIMIT + 5
