"""Columnar chunks: how the embedded backend packs one sensor's readings into blobs.

A chunk is a run of readings of one sensor, sorted by timestamp without
duplicates, stored as two blobs (timestamps, values). Open chunks (still being
merged) are raw little-endian arrays, which decode for free with
``np.frombuffer``; sealed chunks are compressed once: timestamps as deltas and
both columns through zlib level 1 (3-4 bytes per reading for typical sensor
data instead of 16; see docs/storage.md for the measurements that chose it).

Merging follows one rule everywhere: pieces are given oldest write first, and
for equal timestamps the newest write wins.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.readings import Float64Array, Int64Array, sort_dedup

RAW = 0
"""Encoding id: raw int64 / float64 arrays."""
ZLIB = 1
"""Encoding id: delta-encoded timestamps and values, each zlib level 1."""

_LEVEL = 1  # zlib level 1: measured ~3x faster than 6 for <5 % larger output


def encode(ts: Int64Array, vs: Float64Array, enc: int) -> tuple[bytes, bytes]:
    """Blobs for one chunk; ``ts`` sorted, same length as ``vs``."""
    ts = np.ascontiguousarray(ts, dtype="<i8")
    vs = np.ascontiguousarray(vs, dtype="<f8")
    if enc == RAW:
        return ts.tobytes(), vs.tobytes()
    if enc == ZLIB:
        deltas = np.empty_like(ts)
        if ts.shape[0]:
            deltas[0] = ts[0]
            np.subtract(ts[1:], ts[:-1], out=deltas[1:])
        return zlib.compress(deltas.tobytes(), _LEVEL), zlib.compress(vs.tobytes(), _LEVEL)
    raise ValueError(f"unknown chunk encoding {enc}")


def decode(ts_blob: bytes, vs_blob: bytes, enc: int) -> tuple[Int64Array, Float64Array]:
    """Inverse of :func:`encode`. RAW arrays are read-only views of the blobs."""
    if enc == RAW:
        return np.frombuffer(ts_blob, dtype="<i8"), np.frombuffer(vs_blob, dtype="<f8")
    if enc == ZLIB:
        deltas = np.frombuffer(zlib.decompress(ts_blob), dtype="<i8")
        return np.cumsum(deltas, dtype=np.int64), np.frombuffer(
            zlib.decompress(vs_blob), dtype="<f8"
        )
    raise ValueError(f"unknown chunk encoding {enc}")


@dataclass(slots=True)
class Piece:
    """Readings of one sensor from one chunk or one staged write."""

    seq: int
    """Write order: larger is newer, and wins on equal timestamps."""
    ts: Int64Array
    vs: Float64Array
    clean: bool
    """Known sorted by time without duplicates (chunks are; staged writes may not be)."""


def clip(ts: Int64Array, vs: Float64Array, start_ns: int, end_ns: int) -> Piece:
    """The part of a sorted run inside ``[start_ns, end_ns)`` (seq filled by caller)."""
    a = int(np.searchsorted(ts, start_ns, "left")) if ts.shape[0] and ts[0] < start_ns else 0
    b = int(np.searchsorted(ts, end_ns, "left")) if ts.shape[0] and ts[-1] >= end_ns else None
    return Piece(0, ts[a:b], vs[a:b], True)


def merge(pieces: Sequence[Piece]) -> tuple[Int64Array, Float64Array]:
    """One sorted, de-duplicated run from pieces; newest write wins on equal timestamps.

    The common case (clean pieces that follow each other in time) is a plain
    concatenation; anything else falls back to a stable sort in write order.
    """
    items = [p for p in pieces if p.ts.shape[0]]
    if not items:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    by_time = sorted(items, key=lambda p: (int(p.ts[0]), p.seq))
    disjoint = all(p.clean for p in by_time) and all(
        int(by_time[i].ts[0]) > int(by_time[i - 1].ts[-1]) for i in range(1, len(by_time))
    )
    if disjoint:
        if len(by_time) == 1:
            return by_time[0].ts, by_time[0].vs
        return np.concatenate([p.ts for p in by_time]), np.concatenate([p.vs for p in by_time])
    by_seq = sorted(items, key=lambda p: p.seq)  # stable: equal seq keeps given order
    ts = np.concatenate([p.ts for p in by_seq])
    vs = np.concatenate([p.vs for p in by_seq])
    return sort_dedup(ts, vs)


def group_by_key(
    keys: Int64Array, ts: Int64Array, vs: Float64Array
) -> tuple[Int64Array, Int64Array, Int64Array, Float64Array]:
    """Group readings by key (sensor id), each group sorted by time, last write wins.

    Input is in write order. Returns ``(unique_keys, offsets, ts, vs)`` with
    group ``i`` at ``[offsets[i], offsets[i+1])``. Vectorised: one stable sort
    by key, then one lexsort only if some group is out of order or duplicated.
    """
    if keys.shape[0] == 0:
        e = np.empty(0, np.int64)
        return e, np.zeros(1, np.int64), e, np.empty(0, np.float64)
    order = np.argsort(keys, kind="stable")
    k, t, v = keys[order], ts[order], vs[order]
    same = k[1:] == k[:-1]
    if bool(np.any(same & (t[1:] <= t[:-1]))):
        # Out of order or duplicate inside a group: sort by (key, ts, write order)
        # and keep the last of each equal (key, ts).
        order2 = np.lexsort((np.arange(k.shape[0]), t, k))
        k, t, v = k[order2], t[order2], v[order2]
        keep = np.ones(k.shape[0], dtype=bool)
        keep[:-1] = (k[1:] != k[:-1]) | (t[1:] != t[:-1])
        k, t, v = k[keep], t[keep], v[keep]
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    offsets = np.append(starts, k.shape[0]).astype(np.int64)
    return k[starts], offsets, t, v
