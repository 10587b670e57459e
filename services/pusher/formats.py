"""Turn queued group readings into MQTT messages: KVB1 batches or DCDB records.

Both wire formats are specified in ``docs/wire-format.md`` and implemented for
decoding in :mod:`services.common.codec`. The pusher encodes the same bytes
without numpy (it is not imported on a node): a group's relative names, their
lengths and the byte layout of one cycle are computed once per group, so that
a cycle of n sensors is a few ``bytes`` joins of ``array`` buffers, whatever n.
``tests/pusher/test_formats.py`` checks the bytes against the codec.
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, pairwise, repeat
from typing import Any, Literal, Protocol

from services.common import names
from services.common.metadata_json import metadata_payload

Format = Literal["kvb1", "dcdb"]
Mask = Sequence[Any]
"""Per sensor of one cycle: truthy = send this reading."""

BATCH_PREFIX = "/KELVIN_BATCH/"
"""Topic prefix of KVB1 batches (``services.common.codec.BATCH_PREFIX``)."""
METADATA_PREFIX = "/DCDB_MAP/METADATA/"
_BATCH_HEAD = struct.Struct("<4sII")  # magic, n_series, n_readings
_BATCH_HEAD_BYTES = _BATCH_HEAD.size
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_DCDB = struct.Struct("<qQ")
_I64_MAX = float(2**63 - 1024)
_LITTLE = sys.byteorder == "little"


@dataclass(slots=True)
class Message:
    """One PUBLISH: topic, payload and how many readings it carries (0 = control)."""

    topic: str
    payload: bytes
    readings: int


@dataclass(frozen=True, slots=True)
class SensorMetadata:
    """What the collect agent learns about a sensor (DCDB's metadata keys).

    The pusher's own light copy of :class:`services.common.sensors.SensorMetadata`
    (a pydantic model, not imported on a node); the encoders accept either.
    """

    name: str
    public_name: str | None = None
    pattern: str | None = None
    unit: str | None = None
    scale: float = 1.0
    ttl_ms: int | None = None
    interval_ms: int | None = None
    operations: tuple[str, ...] = ()
    integrable: bool = False
    monotonic: bool = False
    delta: bool = False
    is_virtual: bool = False
    is_operation: bool = False


class _Meta(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def scale(self) -> float: ...


def common_prefix(sensor_names: Sequence[str]) -> str:
    """Deepest hierarchy level that every name lies under (``/`` at worst)."""
    if not sensor_names:
        return "/"
    first = names.levels(sensor_names[0])[:-1]
    depth = len(first)
    for n in sensor_names[1:]:
        lv = names.levels(n)[:-1]
        depth = min(depth, len(lv))
        for i in range(depth):
            if lv[i] != first[i]:
                depth = i
                break
    return "/" + "/".join(first[:depth]) if depth else "/"


def _le(a: array[Any]) -> bytes:
    """Little-endian bytes of an array (the wire order; a no-op on x86 and ARM)."""
    if _LITTLE:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


class Route:
    """Everything about a group's sensors that encoding needs, computed once."""

    def __init__(self, metadata: Sequence[_Meta]) -> None:
        self.names = [m.name for m in metadata]
        self.n = len(self.names)
        self.prefix = common_prefix(self.names)
        self.topic = BATCH_PREFIX + ("" if self.prefix == "/" else self.prefix)
        base = 0 if self.prefix == "/" else len(self.prefix)
        self.rel = [n[base:].encode("utf-8") for n in self.names]
        self.lens = array("H", [len(r) for r in self.rel])
        self.lens_bytes = _le(self.lens)
        self.name_ends = [0, *accumulate(self.lens)]
        """Offset of each name in ``blob`` (n + 1 entries)."""
        self.blob = b"".join(self.rel)
        self.scale = [float(m.scale or 1.0) for m in metadata]
        self.ones = _U32.pack(1) * self.n
        """The count column of one cycle: one reading per series."""
        self.sizes_one = [end + 22 * j for j, end in enumerate(self.name_ends)]
        """Cumulative bytes of series 0..j of one cycle (6 + 16 per series + names)."""


def _split(cum: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Series ranges [a, b) whose bytes (``cum[b] - cum[a]``) fit ``budget`` (one at least)."""
    out = []
    a, m = 0, len(cum) - 1
    while a < m:
        b = max(a + 1, min(m, bisect_right(cum, cum[a] + budget) - 1))
        out.append((a, b))
        a = b
    return out


def encode_kvb1(
    route: Route,
    ts: Sequence[int],
    values: Sequence[Sequence[float]],
    mask: Sequence[Mask | None] | None,
    max_bytes: int = 1 << 20,
) -> list[Message]:
    """KVB1 messages for ``k`` cycles: ``ts`` (k), ``values`` (k rows of n), ``mask`` (k rows
    or None: all). A series per sensor with its readings of those cycles."""
    k = len(ts)
    n = route.n
    stamps = [int(t) for t in ts]
    rows = [r if isinstance(r, array) and r.typecode == "d" else array("d", r) for r in values]
    masks = None if mask is None or all(m is None for m in mask) else mask
    budget = max_bytes - _BATCH_HEAD_BYTES
    if masks is None and k == 1:
        return _messages(
            route.topic,
            _split(route.sizes_one, budget),
            route.ones,
            route.lens_bytes,
            route.blob,
            route.name_ends,
            None,
            _I64.pack(stamps[0]) * n,
            _le(rows[0]),
        )
    if masks is None:
        col_ts = _le(array("q", stamps)) * n
        col_vs = array("d", chain.from_iterable(zip(*rows, strict=True)))
        per = 6 + 16 * k
        sizes = [end + per * j for j, end in enumerate(route.name_ends)]
        return _messages(
            route.topic,
            _split(sizes, budget),
            _U32.pack(k) * n,
            route.lens_bytes,
            route.blob,
            route.name_ends,
            [k * j for j in range(n + 1)],
            col_ts,
            _le(col_vs),
        )
    full = b"\x01" * n
    flags = [full if m is None else _flags(m) for m in masks]
    if k == 1:
        keep = flags[0]
        few = _few_left_out(route, stamps[0], rows[0], keep, budget)
        if few is not None:
            return few
        lens = array("H", compress(route.lens, keep))  # C-level selections, no loop per sensor
        m = len(lens)
        if not m:
            return []
        blob = b"".join(compress(route.rel, keep))
        ends = [0, *accumulate(lens)]
        sizes = [0, *accumulate(map(operator.add, lens, repeat(22, m)))]
        return _messages(
            route.topic,
            _split(sizes, budget),
            route.ones[: 4 * m],
            _le(lens),
            blob,
            ends,
            None,
            _I64.pack(stamps[0]) * m,
            _le(array("d", compress(rows[0], keep))),
        )
    sel, counts = [], []
    col_vs = array("d")
    col_t = array("q")
    for j, (vs, ms) in enumerate(
        zip(zip(*rows, strict=True), zip(*flags, strict=True), strict=True)
    ):
        c = sum(ms)
        if c:
            sel.append(j)
            counts.append(c)
            col_vs.extend(compress(vs, ms))
            col_t.extend(compress(stamps, ms))
    if not sel:
        return []
    lens = array("H", [route.lens[j] for j in sel])
    blob = b"".join([route.rel[j] for j in sel])
    ends = [0, *accumulate(lens)]
    rends = [0, *accumulate(counts)]
    sizes = [ends[i] + 6 * i + 16 * rends[i] for i in range(len(sel) + 1)]
    return _messages(
        route.topic,
        _split(sizes, budget),
        _le(array("I", counts)),
        _le(lens),
        blob,
        ends,
        rends,
        _le(col_t),
        _le(col_vs),
    )


def _few_left_out(
    route: Route, stamp: int, row: array[float], keep: bytes, budget: int
) -> list[Message] | None:
    """One cycle where only a few sensors have no reading (an unreadable file, a NaN): the
    payload is the precomputed full columns spliced around them, one message. None when
    more are left out, or when it would need splitting (the general path does that)."""
    n = route.n
    out: list[int] = []
    pos = keep.find(0)
    while pos >= 0:
        out.append(pos)
        if len(out) * 8 > n:
            return None
        pos = keep.find(0, pos + 1)
    m = n - len(out)
    if not m:
        return []
    sizes = route.sizes_one
    left_out = sum(sizes[j + 1] - sizes[j] for j in out)
    if sizes[n] - left_out > budget:
        return None
    bounds = [-1, *out, n]
    spans = [(a + 1, b) for a, b in pairwise(bounds) if b > a + 1]
    ends = route.name_ends
    values = _le(row)
    payload = b"".join(
        (
            _BATCH_HEAD.pack(b"KVB1", m, m),
            route.ones[: 4 * m],
            b"".join([route.lens_bytes[2 * a : 2 * b] for a, b in spans]),
            b"".join([route.blob[ends[a] : ends[b]] for a, b in spans]),
            _I64.pack(stamp) * m,
            b"".join([values[8 * a : 8 * b] for a, b in spans]),
        )
    )
    return [Message(route.topic, payload, m)]


def _flags(mask: Mask) -> bytes:
    """A mask as one byte per sensor (0 or 1), without a loop for byte-wide masks."""
    if isinstance(mask, (bytes, bytearray)):
        return bytes(mask)
    if isinstance(mask, array) and mask.typecode in "bB":
        return mask.tobytes()
    return bytes(bool(x) for x in mask)


def _messages(
    topic: str,
    ranges: list[tuple[int, int]],
    counts: bytes,
    lens: bytes,
    blob: bytes,
    name_ends: Sequence[int],
    reading_ends: Sequence[int] | None,
    col_ts: bytes,
    col_vs: bytes,
) -> list[Message]:
    """One payload per series range, slicing the columns (``reading_ends`` None: one per series)."""
    out = []
    for a, b in ranges:
        ra, rb = (a, b) if reading_ends is None else (reading_ends[a], reading_ends[b])
        payload = b"".join(
            (
                _BATCH_HEAD.pack(b"KVB1", b - a, rb - ra),
                counts[4 * a : 4 * b],
                lens[2 * a : 2 * b],
                blob[name_ends[a] : name_ends[b]],
                col_ts[8 * ra : 8 * rb],
                col_vs[8 * ra : 8 * rb],
            )
        )
        out.append(Message(topic, payload, rb - ra))
    return out


def _dcdb_int(value: float, scale: float) -> int:
    x = value / scale
    return round(_I64_MAX if x > _I64_MAX else -_I64_MAX if x < -_I64_MAX else x)


def encode_dcdb(
    route: Route,
    ts: Sequence[int],
    values: Sequence[Sequence[float]],
    mask: Sequence[Mask | None] | None,
) -> list[Message]:
    """One DCDB message per sensor with all its queued readings (16-byte records,
    ``rint(value / scale)`` as int64, then the timestamp)."""
    stamps = [int(t) for t in ts]
    if len(stamps) == 1 and (mask is None or mask[0] is None):
        fast = _dcdb_one_cycle(route, stamps[0], values[0])
        if fast is not None:
            return fast
    out = []
    rows = [list(r) for r in values]
    flags = [None] * len(rows) if mask is None else list(mask)
    for j, name in enumerate(route.names):
        scale = route.scale[j]
        records = [
            _DCDB.pack(_dcdb_int(row[j], scale), t)
            for t, row, m in zip(stamps, rows, flags, strict=True)
            if (m is None or m[j]) and row[j] == row[j]
        ]
        if records:
            out.append(Message(name, b"".join(records), len(records)))
    return out


def _dcdb_one_cycle(route: Route, stamp: int, row: Sequence[float]) -> list[Message] | None:
    """The common case (one cycle, every reading sent) with one array write per column;
    None when a value needs clipping to int64 (the general path handles it)."""
    n = route.n
    try:
        ints = array("q", map(round, map(operator.truediv, row, route.scale)))
    except (OverflowError, ValueError):
        return None
    rec = array("q", bytes(16 * n))
    rec[0::2] = ints
    rec[1::2] = array("q", [stamp]) * n
    buf = _le(rec)
    return [Message(name, buf[16 * j : 16 * j + 16], 1) for j, name in enumerate(route.names)]


def encode(
    fmt: Format,
    route: Route,
    ts: Sequence[int],
    values: Sequence[Sequence[float]],
    mask: Sequence[Mask | None] | None,
    max_bytes: int = 1 << 20,
) -> list[Message]:
    if fmt == "dcdb":
        return encode_dcdb(route, ts, values, mask)
    return encode_kvb1(route, ts, values, mask, max_bytes)


def metadata_message(meta: SensorMetadata | Any) -> Message:
    """The DCDB metadata PUBLISH of a sensor (the bytes of ``codec.encode_metadata``)."""
    return Message(METADATA_PREFIX + meta.name, metadata_payload(meta), 0)
