"""ClickHouse wire formats from and to numpy: Native blocks in, RowBinary rows out.

A Native block is ``varuint columns, varuint rows`` then, per column, its name,
its type and its data: fixed-width numbers as little-endian arrays (the numpy
buffer as is) and ``String`` as ``varuint length + bytes`` per row. The sensor
column of a batch is built per *series* (one bytes multiplication each, in C
through ``map``), never per reading. SQL literals are escaped here too, since
ClickHouse 18.16 has no query parameters.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from services.common.readings import Batch, Float64Array, Int64Array

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
_TRANS = str.maketrans(_ESCAPES)


def varuint(n: int) -> bytes:
    """LEB128, as ClickHouse writes lengths and counts."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(value: str) -> bytes:
    """One ``String`` value: length + UTF-8 bytes."""
    data = value.encode("utf-8", "surrogatepass")
    return varuint(len(data)) + data


def literal(value: str) -> str:
    """A ClickHouse string literal (quotes, backslashes and control characters escaped)."""
    return "'" + value.translate(_TRANS) + "'"


def literals(values: Sequence[str]) -> str:
    """``('a', 'b')`` for ``IN``; ``('')`` when empty so the SQL stays valid."""
    return "(" + (", ".join(literal(v) for v in values) or "''") + ")"


class StringCache:
    """Encoded ``String`` values and small integer ids of names seen before (the same
    sensors arrive over and over, so both are one C-level dict lookup per series)."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self._encoded: dict[str, bytes] = {}
        self._ids: dict[str, int] = {}
        self.names: list[str] = []
        """Name of each id."""
        self._limit = limit

    def _learn(self, names: Sequence[str]) -> None:
        if len(self._ids) > self._limit:
            self._encoded.clear()
            self._ids.clear()
            self.names.clear()
        for n in names:
            if n not in self._ids:
                self._encoded[n] = string(n)
                self._ids[n] = len(self.names)
                self.names.append(n)

    def _lookup(self, table: dict[str, Any], names: Sequence[str]) -> list[Any]:
        if not names:
            return []
        try:
            got = operator.itemgetter(*names)(table)
        except KeyError:
            self._learn(names)
            got = operator.itemgetter(*names)(table)
        return list(got) if len(names) > 1 else [got]

    def encode(self, names: Sequence[str]) -> list[bytes]:
        return self._lookup(self._encoded, names)

    def ids(self, names: Sequence[str]) -> npt.NDArray[np.int64]:
        return np.array(self._lookup(self._ids, names), dtype=np.int64)


def earliest_per_name(names: StringCache, batch: Batch) -> tuple[list[str], Int64Array]:
    """The distinct sensors of a batch and each one's earliest timestamp (vectorised:
    one lookup per series, no Python loop per reading or per repeat of a sensor)."""
    counts = batch.counts
    nonempty = np.flatnonzero(counts)
    if nonempty.shape[0] == 0:
        return [], np.empty(0, np.int64)
    mins = np.minimum.reduceat(batch.timestamps_ns, batch.offsets[:-1][nonempty])
    sensors = batch.sensors
    if nonempty.shape[0] != len(sensors):
        sensors = [sensors[i] for i in nonempty.tolist()]
    ids = names.ids(sensors)
    order = np.lexsort((mins, ids))
    ids, mins = ids[order], mins[order]
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return [names.names[i] for i in ids[first].tolist()], mins[first]


def column(name: str, type_: str, data: bytes | memoryview) -> list[bytes | memoryview]:
    return [string(name), string(type_), data]


def block(rows: int, columns: Sequence[list[bytes | memoryview]]) -> list[bytes | memoryview]:
    """The parts of one Native block (send them as one body, in order)."""
    parts: list[bytes | memoryview] = [varuint(len(columns)), varuint(rows)]
    for c in columns:
        parts.extend(c)
    return parts


def repeated(encoded: Sequence[bytes], counts: Sequence[int]) -> bytes:
    """``String`` column data: ``encoded[i]`` repeated ``counts[i]`` times, in order."""
    return b"".join(map(operator.mul, encoded, counts))


def readings_block(batch: Batch, names: StringCache) -> list[bytes | memoryview]:
    """The Native block ``(sensor String, ts Int64, value Float64)`` of a whole batch."""
    ts = np.ascontiguousarray(batch.timestamps_ns, dtype="<i8")
    vs = np.ascontiguousarray(batch.values, dtype="<f8")
    sensors = repeated(names.encode(batch.sensors), batch.counts.tolist())
    return block(
        len(batch),
        [
            column("sensor", "String", sensors),
            column("ts", "Int64", ts.data.cast("B")),
            column("value", "Float64", vs.data.cast("B")),
        ],
    )


def slice_batch(batch: Batch, max_rows: int) -> list[Batch]:
    """Cut a batch into batches of at most ``max_rows`` readings (a series may be split)."""
    n = len(batch)
    if n <= max_rows:
        return [batch]
    out = []
    offsets = batch.offsets
    for a in range(0, n, max_rows):
        b = min(a + max_rows, n)
        i = int(np.searchsorted(offsets, a, "right")) - 1
        j = int(np.searchsorted(offsets, b, "left"))
        sub = np.clip(offsets[i : j + 1], a, b) - a
        out.append(
            Batch(
                list(batch.sensors[i:j]),
                sub.astype(np.int64),
                batch.timestamps_ns[a:b],
                batch.values[a:b],
            )
        )
    return out


_POINT = np.dtype([("ts", "<i8"), ("value", "<f8")])
_INDEXED = np.dtype([("i", "<u4"), ("ts", "<i8"), ("value", "<f8")])


def read_varuint(buf: bytes | bytearray, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, at
        shift += 7


def _read_string(buf: bytes | bytearray, at: int) -> tuple[str, int]:
    n, at = read_varuint(buf, at)
    return bytes(buf[at : at + n]).decode(), at + n


def native_points(body: bytes | bytearray) -> tuple[Int64Array, Float64Array]:
    """Native blocks ``(ts Int64, value Float64)`` -> two arrays (columnar on the wire:
    one contiguous copy per column, none at all for a one-block answer)."""
    ts_parts: list[np.ndarray] = []
    vs_parts: list[np.ndarray] = []
    at, end = 0, len(body)
    while at < end:
        ncols, at = read_varuint(body, at)
        nrows, at = read_varuint(body, at)
        if ncols != 2:
            raise ValueError(f"Native answer has {ncols} columns; expected (ts, value)")
        for parts, dtype in ((ts_parts, "<i8"), (vs_parts, "<f8")):
            _, at = _read_string(body, at)
            kind, at = _read_string(body, at)
            if kind not in ("Int64", "Float64"):
                raise ValueError(f"Native answer column of type {kind}; expected Int64/Float64")
            if at + 8 * nrows > end:
                raise ValueError(f"Native answer of {end} bytes is cut short")
            parts.append(np.frombuffer(body, dtype, nrows, at))
            at += 8 * nrows
    if not ts_parts:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    if len(ts_parts) == 1:
        return ts_parts[0].astype(np.int64, copy=False), vs_parts[0].astype(np.float64, copy=False)
    return np.concatenate(ts_parts).astype(np.int64), np.concatenate(vs_parts).astype(np.float64)


def points(body: bytes | bytearray) -> tuple[Int64Array, Float64Array]:
    """RowBinary rows ``(ts Int64, value Float64)`` -> two contiguous arrays."""
    if len(body) % _POINT.itemsize:
        raise ValueError(f"RowBinary answer of {len(body)} bytes is not whole (ts, value) rows")
    rows = np.frombuffer(body, dtype=_POINT)
    return rows["ts"].copy(), rows["value"].copy()


def sorted_points(body: bytes | bytearray) -> tuple[Int64Array, Float64Array]:
    """:func:`native_points`, sorted by time (a no-op check when they already are)."""
    ts, vs = native_points(body)
    if ts.shape[0] > 1 and not bool(np.all(ts[1:] > ts[:-1])):
        order = np.argsort(ts, kind="stable")
        ts, vs = ts[order], vs[order]
    return ts, vs


def indexed_points(body: bytes | bytearray) -> tuple[np.ndarray, Int64Array, Float64Array]:
    """RowBinary rows ``(i UInt32, ts Int64, value Float64)`` -> three arrays."""
    if len(body) % _INDEXED.itemsize:
        raise ValueError(f"RowBinary answer of {len(body)} bytes is not whole (i, ts, value) rows")
    rows = np.frombuffer(body, dtype=_INDEXED)
    return rows["i"].astype(np.int64), rows["ts"].copy(), rows["value"].copy()
