"""Columnar chunks of stored virtual-sensor results (the SQLite backend keeps them as blobs).

Virtual results are a cache on a regular grid: their timestamps are evenly
spaced and their values are computed floats (full mantissas). So a chunk
stores the timestamps as ``(first, step)`` when they are evenly spaced
(:data:`GRID`, 16 bytes whatever the length) and the values raw: zlib gains
~10 % on such values but costs ~100 ns per point to decompress, ten times
reading them raw (docs/storage.md). Irregular timestamps (the protocol
allows any) fall back to raw arrays (:data:`chunks.RAW`).

One sensor's chunks never overlap in time (a write first drops what it
replaces), so ordered by their last timestamp they are ordered by their first
too, which lets a read stop at the first chunk that starts past its range.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from services.common.readings import Float64Array, Int64Array
from services.common.storage import chunks

GRID = 2
"""Encoding id: timestamps ``first + i * step`` (two int64), values raw float64."""
CHUNK_POINTS = 8192
"""Points per chunk: 64 KiB of values, a bounded cost to trim at an invalidation edge."""

_GRID_HEAD = struct.Struct("<qq")


@dataclass(slots=True)
class Chunk:
    """A run of one virtual sensor's stored results, sorted by time."""

    t0: int
    t1: int
    """First and last timestamp (inclusive)."""
    ts: Int64Array
    vs: Float64Array

    @property
    def n(self) -> int:
        return int(self.ts.shape[0])


def encode(ts: Int64Array, vs: Float64Array) -> tuple[int, bytes, bytes]:
    """``(encoding, ts_blob, vs_blob)`` for a sorted run; GRID when evenly spaced."""
    ts = np.ascontiguousarray(ts, dtype="<i8")
    vs = np.ascontiguousarray(vs, dtype="<f8")
    n = ts.shape[0]
    step = int(ts[1]) - int(ts[0]) if n > 1 else 0
    # a positive step below 2**63 also rules out int64 wrap-around in the differences
    if n == 1 or (0 < step < 2**63 and (n == 2 or bool(np.all(np.diff(ts) == step)))):
        return GRID, _GRID_HEAD.pack(int(ts[0]), step), vs.tobytes()
    tb, vb = chunks.encode(ts, vs, chunks.RAW)
    return chunks.RAW, tb, vb


def decode(enc: int, n: int, ts_blob: bytes, vs_blob: bytes) -> tuple[Int64Array, Float64Array]:
    """Inverse of :func:`encode`; values are read-only views of ``vs_blob``."""
    if enc == GRID:
        first, step = _GRID_HEAD.unpack(ts_blob)
        ts = np.arange(n, dtype=np.int64)
        ts *= step
        ts += first
        return ts, np.frombuffer(vs_blob, dtype="<f8")
    return chunks.decode(ts_blob, vs_blob, enc)


def split(ts: Int64Array, vs: Float64Array, size: int | None = None) -> Iterator[Chunk]:
    """Cut a sorted run into chunks of at most ``size`` (:data:`CHUNK_POINTS`) points."""
    size = size or CHUNK_POINTS
    for i in range(0, ts.shape[0], size):
        t, v = ts[i : i + size], vs[i : i + size]
        yield Chunk(int(t[0]), int(t[-1]), t, v)


def outside(chunk: Chunk, start_ns: int, end_ns: int) -> list[Chunk]:
    """What is left of ``chunk`` once ``[start_ns, end_ns)`` is removed (0, 1 or 2 chunks)."""
    a = int(np.searchsorted(chunk.ts, start_ns, "left"))
    b = int(np.searchsorted(chunk.ts, end_ns, "left"))
    out = []
    for lo, hi in ((0, a), (b, chunk.n)):
        if hi > lo:
            out.append(
                Chunk(int(chunk.ts[lo]), int(chunk.ts[hi - 1]), chunk.ts[lo:hi], chunk.vs[lo:hi])
            )
    return out


def assemble(
    parts: Iterable[tuple[Int64Array, Float64Array]], start_ns: int, end_ns: int
) -> tuple[Int64Array, Float64Array]:
    """Time-ordered, non-overlapping runs -> one run clipped to ``[start_ns, end_ns)``."""
    ts_parts, vs_parts = [], []
    for ts, vs in parts:
        if ts.shape[0] and (ts[0] < start_ns or ts[-1] >= end_ns):
            a = int(np.searchsorted(ts, start_ns, "left"))
            b = int(np.searchsorted(ts, end_ns, "left"))
            ts, vs = ts[a:b], vs[a:b]
        if ts.shape[0]:
            ts_parts.append(ts)
            vs_parts.append(vs)
    if not ts_parts:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    # concatenate copies: the result never aliases a blob, so it is writeable
    return np.concatenate(ts_parts), np.concatenate(vs_parts)
