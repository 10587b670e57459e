"""Prometheus' XOR ("Gorilla") chunk encoding, for streamed remote-read responses.

A chunk is a big-endian uint16 sample count and a bit stream: the first timestamp
(signed varint) and value (64 bits), the second timestamp as a delta (unsigned
varint), then per sample a delta-of-delta timestamp in one of five widths and the
value XORed with the previous one. The encoder writes every non-zero XOR with its
own leading-zero count and width (the ``11`` form); Prometheus' reader accepts
that everywhere, and it lets all fields of a chunk be computed and packed by numpy
at once rather than bit by bit. :func:`decode` reads any valid chunk (Prometheus'
own included), for tests and for clients.
"""

from __future__ import annotations

import numpy as np

from services.common.prompb import put_varint

SAMPLES_PER_CHUNK = 120
"""Prometheus cuts head chunks at 120 samples."""

_U64 = np.uint64


def _zigzag(t: int) -> int:
    return (t << 1) ^ (t >> 63)


def _clz64(x: np.ndarray) -> np.ndarray:
    """Leading zeros of uint64 values (x > 0)."""
    n = np.zeros(x.shape, dtype=np.int64)
    y = x.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        top = (y >> _U64(64 - shift)) == 0
        n += np.where(top, shift, 0)
        y = np.where(top, y << _U64(shift), y)
    return n


def _ctz64(x: np.ndarray) -> np.ndarray:
    """Trailing zeros of uint64 values (x > 0)."""
    low = x & (~x + _U64(1))  # lowest set bit
    return 63 - _clz64(low)


def _pack(values: np.ndarray, widths: np.ndarray) -> bytes:
    """Concatenate the low ``widths[i]`` bits of ``values[i]``, most significant bit first."""
    widths = widths.astype(np.int64)
    total = int(widths.sum())
    if total == 0:
        return b""
    starts = np.zeros(widths.shape[0], dtype=np.int64)
    np.cumsum(widths[:-1], out=starts[1:])
    field = np.repeat(np.arange(widths.shape[0]), widths)
    j = np.arange(total) - starts[field]
    shift = (widths[field] - 1 - j).astype(np.uint64)
    bits = ((values[field] >> shift) & _U64(1)).astype(np.uint8)
    return np.packbits(bits).tobytes()


def encode(ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    """One chunk of 1 to 65535 samples (ascending times in ms)."""
    n = int(ts_ms.shape[0])
    if not 0 < n < 65536:
        raise ValueError(f"a chunk holds 1 to 65535 samples, not {n}")
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    head = bytearray(n.to_bytes(2, "big"))
    head += put_varint(_zigzag(int(ts_ms[0])))
    fields_v: list[np.ndarray] = [
        np.frombuffer(bytes(head), dtype=np.uint8).astype(np.uint64),
        bits[:1],
    ]
    fields_w: list[np.ndarray] = [np.full(len(head), 8, dtype=np.int64), np.array([64])]
    if n > 1:
        delta0 = put_varint(int(ts_ms[1] - ts_ms[0]))
        fields_v.append(np.frombuffer(delta0, dtype=np.uint8).astype(np.uint64))
        fields_w.append(np.full(len(delta0), 8, dtype=np.int64))
        t = ts_ms.astype(np.int64)
        deltas = np.diff(t)
        dod = np.concatenate([[0], np.diff(deltas)])  # dod[i] belongs to sample i + 1
        # per sample from the second: [time control, time payload, value head, value bits]
        k = n - 1
        tc_v = np.zeros(k, dtype=np.uint64)
        tc_w = np.zeros(k, dtype=np.int64)
        tp_v = dod.astype(np.int64).view(np.uint64)
        tp_w = np.zeros(k, dtype=np.int64)
        for ctrl, width, size in ((0b10, 2, 14), (0b110, 3, 17), (0b1110, 4, 20)):
            fits = (
                (tc_w == 0)
                & (dod >= -((1 << (size - 1)) - 1))
                & (dod <= 1 << (size - 1))
                & (dod != 0)
            )
            tc_v[fits], tc_w[fits], tp_w[fits] = ctrl, width, size
        zero = dod == 0
        tc_w[zero] = 1  # a single 0 bit
        rest = tc_w == 0
        tc_v[rest], tc_w[rest], tp_w[rest] = 0b1111, 4, 64
        tc_w[0], tp_w[0] = 0, 0  # the second sample's time was the varint delta
        x = bits[1:] ^ bits[:-1]
        nz = x != 0
        lead = np.zeros(k, dtype=np.int64)
        trail = np.zeros(k, dtype=np.int64)
        if bool(nz.any()):
            lead[nz] = np.minimum(_clz64(x[nz]), 31)
            trail[nz] = _ctz64(x[nz])
        sig = 64 - lead - trail
        vh_v = np.where(nz, (0b11 << 11) | (lead << 6) | (sig & 63), 0).astype(np.uint64)
        vh_w = np.where(nz, 13, 1)
        vb_v = np.where(nz, x >> np.where(nz, trail, 0).astype(np.uint64), 0).astype(np.uint64)
        vb_w = np.where(nz, sig, 0)
        fields_v.append(np.stack([tc_v, tp_v, vh_v, vb_v], axis=1).ravel())
        fields_w.append(np.stack([tc_w, tp_w, vh_w, vb_w], axis=1).ravel())
    return _pack(np.concatenate(fields_v), np.concatenate(fields_w))


class _Bits:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0  # in bits

    def read(self, n: int) -> int:
        out = 0
        for _ in range(n):
            byte = self.data[self.pos >> 3]
            out = (out << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return out

    def varint(self, signed_: bool) -> int:
        result = shift = 0
        while True:
            b = self.read(8)
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if signed_:
            return (result >> 1) ^ -(result & 1)
        return result


def decode(chunk: bytes) -> tuple[list[int], list[float]]:
    """(times ms, values) of an XOR chunk (bit by bit: for tests and small chunks)."""
    n = int.from_bytes(chunk[:2], "big")
    r = _Bits(chunk[2:])
    ts: list[int] = []
    vbits: list[int] = []
    lead = trail = 0
    delta = 0
    for i in range(n):
        if i == 0:
            ts.append(r.varint(True))
            vbits.append(r.read(64))
            continue
        if i == 1:
            delta = r.varint(False)
        else:
            width = 64  # control bits 0, 10, 110, 1110, 1111
            for size in (0, 14, 17, 20):
                if r.read(1) == 0:
                    width = size
                    break
            if width == 0:
                dod = 0
            else:
                dod = r.read(width)
                if width < 64 and dod > (1 << (width - 1)):
                    dod -= 1 << width
                elif width == 64 and dod >= 1 << 63:
                    dod -= 1 << 64
            delta += dod
        ts.append(ts[-1] + delta)
        if r.read(1) == 0:
            vbits.append(vbits[-1])
            continue
        if r.read(1) == 1:
            lead = r.read(5)
            sig = r.read(6) or 64
            trail = 64 - lead - sig
        else:
            sig = 64 - lead - trail
        vbits.append(vbits[-1] ^ (r.read(sig) << trail))
    values = np.array(vbits, dtype=np.uint64).view(np.float64).tolist() if vbits else []
    return ts, values
