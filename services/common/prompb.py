"""The few Prometheus protobuf messages Kelvin speaks (prompb: remote write and remote read).

Hand-written wire format instead of generated code: ``Label``, ``Sample``,
``TimeSeries``, ``WriteRequest``, ``ReadRequest``/``Query``/``LabelMatcher``,
``ReadResponse``/``QueryResult`` and ``ChunkedReadResponse``/``ChunkedSeries``/``Chunk``.
Samples are encoded by numpy (a series of any length costs a few array
operations), everything else is small. Field numbers follow prometheus/prompb
``types.proto`` and ``remote.proto``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np


class ProtobufError(ValueError):
    """Bytes that are not the message they claim to be."""


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at ``pos``."""
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ProtobufError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def skip(buf: bytes, pos: int, wire: int) -> int:
    """The position after a field of wire type ``wire`` whose value starts at ``pos``."""
    if wire == 0:
        return varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = varint(buf, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise ProtobufError(f"unsupported protobuf wire type {wire}")


def fields(buf: bytes, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, value start, value end)`` of each field; for
    length-delimited fields the value excludes its length prefix."""
    end = len(buf) if end is None else end
    while pos < end:
        tag, pos = varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            n, start = varint(buf, pos)
            pos = start + n
            yield tag >> 3, wire, start, pos
        else:
            start = pos
            pos = skip(buf, pos, wire)
            yield tag >> 3, wire, start, pos
        if pos > end:
            raise ProtobufError("a field runs past the end of its message")


def signed(n: int) -> int:
    """An int64 field read as an unsigned varint."""
    return n - (1 << 64) if n >= 1 << 63 else n


# ---------------------------------------------------------------------- encoding
def put_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def put_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return put_varint(number << 3 | 2) + put_varint(len(payload)) + payload


def put_int(number: int, value: int) -> bytes:
    return put_varint(number << 3) + put_varint(value) if value else b""


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of many uint64 values at once: (all bytes, length of each)."""
    v = values.astype(np.uint64)
    nbytes = np.ones(v.shape[0], dtype=np.int64)
    for k in range(1, 10):
        nbytes += (v >> np.uint64(7 * k)) > 0
    total = int(nbytes.sum())
    out = np.empty(total, dtype=np.uint8)
    starts = np.zeros(v.shape[0], dtype=np.int64)
    np.cumsum(nbytes[:-1], out=starts[1:])
    for k in range(10):
        has = nbytes > k
        if not bool(has.any()):
            break
        byte = ((v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = (nbytes[has] > k + 1).astype(np.uint8) << 7
        out[starts[has] + k] = byte | more
    return out, nbytes


def samples(ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    """``Sample`` fields (``TimeSeries`` field 2) of one series: ``12 len 09 <double> 10 <varint>``."""
    n = ts_ms.shape[0]
    if n == 0:
        return b""
    tv, tlen = varints(ts_ms.astype(np.int64).view(np.uint64))
    has_t = ts_ms != 0  # proto3 leaves zero out
    size = 9 + np.where(has_t, 1 + tlen, 0)
    rec = 2 + size
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(rec[:-1], out=starts[1:])
    out = np.zeros(int(rec.sum()), dtype=np.uint8)
    out[starts] = 0x12
    out[starts + 1] = size.astype(np.uint8)
    out[starts + 2] = 0x09
    vbytes = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
    out[(starts + 3)[:, None] + np.arange(8)] = vbytes
    out[starts[has_t] + 11] = 0x10
    tstarts = np.zeros(n, dtype=np.int64)
    np.cumsum(tlen[:-1], out=tstarts[1:])
    src = np.arange(tv.shape[0]) - np.repeat(tstarts, tlen)  # index within each varint
    dst = np.repeat(starts + 12, tlen) + src
    keep = np.repeat(has_t, tlen)
    out[dst[keep]] = tv[keep]
    return out.tobytes()


def labels_bytes(labels: Sequence[tuple[str, str]]) -> bytes:
    """``Label`` fields (field 1 of ``TimeSeries`` and ``ChunkedSeries``)."""
    return b"".join(
        put_field(1, put_field(1, k.encode()) + put_field(2, v.encode())) for k, v in labels
    )


def time_series(labels: Sequence[tuple[str, str]], ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    return labels_bytes(labels) + samples(ts_ms, values)


def write_request(
    series: Sequence[tuple[Sequence[tuple[str, str]], np.ndarray, np.ndarray]],
) -> bytes:
    return b"".join(put_field(1, time_series(lab, ts, vs)) for lab, ts, vs in series)


# ---------------------------------------------------------------------- remote read
MATCH_OPS = {0: "=", 1: "!=", 2: "=~", 3: "!~"}
SAMPLES, STREAMED_XOR_CHUNKS = 0, 1


@dataclass
class Query:
    start_ms: int = 0
    end_ms: int = 0
    matchers: list[tuple[str, str, str]] = field(default_factory=list)
    """(name, op, value), op one of = != =~ !~."""


@dataclass
class ReadRequest:
    queries: list[Query] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)


def read_request(buf: bytes) -> ReadRequest:
    req = ReadRequest()
    for num, wire, a, b in fields(buf):
        if num == 1 and wire == 2:
            req.queries.append(_query(buf, a, b))
        elif num == 2 and wire == 0:
            req.accepted.append(varint(buf, a)[0])
        elif num == 2 and wire == 2:  # packed
            pos = a
            while pos < b:
                v, pos = varint(buf, pos)
                req.accepted.append(v)
    return req


def _query(buf: bytes, a: int, b: int) -> Query:
    q = Query()
    for num, wire, x, y in fields(buf, a, b):
        if num == 1 and wire == 0:
            q.start_ms = signed(varint(buf, x)[0])
        elif num == 2 and wire == 0:
            q.end_ms = signed(varint(buf, x)[0])
        elif num == 3 and wire == 2:
            kind, name, value = 0, "", ""
            for n2, w2, s, e in fields(buf, x, y):
                if n2 == 1 and w2 == 0:
                    kind = varint(buf, s)[0]
                elif n2 == 2 and w2 == 2:
                    name = buf[s:e].decode("utf-8")
                elif n2 == 3 and w2 == 2:
                    value = buf[s:e].decode("utf-8")
            if kind not in MATCH_OPS:
                raise ProtobufError(f"unknown label matcher type {kind}")
            q.matchers.append((name, MATCH_OPS[kind], value))
    return q


def encode_read_request(queries: Sequence[Query], accepted: Sequence[int] = ()) -> bytes:
    out = b""
    for q in queries:
        body = put_int(1, q.start_ms) + put_int(2, q.end_ms)
        for name, op, value in q.matchers:
            kind = {v: k for k, v in MATCH_OPS.items()}[op]
            body += put_field(
                3, put_int(1, kind) + put_field(2, name.encode()) + put_field(3, value.encode())
            )
        out += put_field(1, body)
    for a in accepted:
        out += put_varint(2 << 3) + put_varint(a)
    return out


def read_response(results: Sequence[Sequence[bytes]]) -> bytes:
    """``ReadResponse``: one ``QueryResult`` per query, each of encoded ``TimeSeries`` bodies."""
    return b"".join(put_field(1, b"".join(put_field(1, ts) for ts in series)) for series in results)


def chunk(min_ms: int, max_ms: int, data: bytes) -> bytes:
    """``Chunk`` (XOR encoded): field 3 ``type`` is XOR = 1."""
    return put_int(1, min_ms) + put_int(2, max_ms) + put_int(3, 1) + put_field(4, data)


def chunked_series(labels: Sequence[tuple[str, str]], chunks: Sequence[bytes]) -> bytes:
    return labels_bytes(labels) + b"".join(put_field(2, c) for c in chunks)


def chunked_read_response(series: Sequence[bytes], query_index: int) -> bytes:
    return b"".join(put_field(1, s) for s in series) + put_int(2, query_index)
