"""Turn queued group readings into MQTT messages: KVB1 batches or DCDB records.

Both wire formats are specified in ``docs/wire-format.md`` and implemented for
decoding in :mod:`services.common.codec`. The pusher encodes the same bytes
with what it can precompute per group (relative names, their lengths, DCDB
scales) so that a cycle of 10k sensors is a handful of numpy calls;
``tests/pusher/test_formats.py`` checks the bytes against the codec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from services.common import codec, names
from services.common.readings import Float64Array, Int64Array
from services.common.sensors import SensorMetadata
from services.pusher.processing import BoolArray

Format = Literal["kvb1", "dcdb"]
_I64_MAX = float(2**63 - 1024)


@dataclass(slots=True)
class Message:
    """One PUBLISH: topic, payload and how many readings it carries (0 = control)."""

    topic: str
    payload: bytes
    readings: int


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


class Route:
    """Everything about a group's sensors that encoding needs, computed once."""

    def __init__(self, metadata: Sequence[SensorMetadata]) -> None:
        self.names = [m.name for m in metadata]
        self.n = len(self.names)
        self.prefix = common_prefix(self.names)
        self.topic = codec.BATCH_PREFIX + ("" if self.prefix == "/" else self.prefix)
        base = 0 if self.prefix == "/" else len(self.prefix)
        self.rel = [n[base:].encode("utf-8") for n in self.names]
        self.lens = np.fromiter((len(r) for r in self.rel), dtype="<u2", count=self.n)
        self.name_ends = np.cumsum(self.lens, dtype=np.int64)
        self.blob = b"".join(self.rel)
        self.scale = np.array([m.scale or 1.0 for m in metadata], dtype=np.float64)


def _kvb1(
    route: Route,
    idx: slice | np.ndarray,
    counts: np.ndarray,
    ts: Int64Array,
    vs: Float64Array,
) -> bytes:
    if isinstance(idx, slice):
        a, b = idx.start, idx.stop
        lo = 0 if a == 0 else int(route.name_ends[a - 1])
        blob = route.blob[lo : int(route.name_ends[b - 1])]
        lens = route.lens[idx]
    else:
        blob = b"".join([route.rel[i] for i in idx.tolist()])
        lens = route.lens[idx]
    return codec.encode_batch_columns(counts, lens, blob, ts, vs)


def encode_kvb1(
    route: Route,
    ts: Int64Array,
    values: Float64Array,
    mask: BoolArray | None,
    max_bytes: int = 1 << 20,
) -> list[Message]:
    """KVB1 messages for ``k`` cycles: ``ts`` (k,), ``values`` (k, n), ``mask`` (k, n)."""
    k, n = values.shape
    if mask is None:
        per_sensor = 6 + 16 * k + int(route.lens.mean() if n else 0)
        step = max(1, min(n, max_bytes // max(per_sensor, 1)))
        out = []
        for a in range(0, n, step):
            b = min(n, a + step)
            flat_v = values[:, a:b].T.ravel() if k > 1 else values[0, a:b]
            flat_t = np.tile(ts, b - a) if k > 1 else np.full(b - a, ts[0], dtype=np.int64)
            counts = np.full(b - a, k, dtype="<u4")
            payload = _kvb1(route, slice(a, b), counts, flat_t, flat_v)
            out.append(Message(route.topic, payload, (b - a) * k))
        return out
    mt = mask.T
    counts_all = mt.sum(axis=1)
    keep = np.flatnonzero(counts_all)
    if keep.shape[0] == 0:
        return []
    flat_v = values.T[mt]
    flat_t = np.broadcast_to(ts, (n, k))[mt]
    counts = counts_all[keep]
    ends = np.cumsum(counts)
    # Split by the series' real sizes (count, name length) so no payload exceeds max_bytes.
    sizes = np.cumsum(6 + 16 * counts + route.lens[keep].astype(np.int64))
    budget = max_bytes - codec.BATCH_HEAD_BYTES
    out = []
    a = 0
    while a < keep.shape[0]:
        used = int(sizes[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(sizes, used + budget, side="right")))
        lo = 0 if a == 0 else int(ends[a - 1])
        hi = int(ends[b - 1])
        payload = _kvb1(route, keep[a:b], counts[a:b], flat_t[lo:hi], flat_v[lo:hi])
        out.append(Message(route.topic, payload, hi - lo))
        a = b
    return out


def encode_dcdb(
    route: Route, ts: Int64Array, values: Float64Array, mask: BoolArray | None
) -> list[Message]:
    """One DCDB message per sensor with all its queued readings (16-byte records)."""
    k, n = values.shape
    ints = np.rint(np.clip(values.T / route.scale[:, None], -_I64_MAX, _I64_MAX))
    rec = np.empty((n, k), dtype=codec.DCDB_RECORD)
    with np.errstate(invalid="ignore"):  # NaN = no reading: masked out below, never sent
        rec["value"] = ints
    rec["ts"] = ts[None, :]
    if mask is None:
        buf = rec.tobytes()
        size = 16 * k
        return [
            Message(name, buf[j * size : (j + 1) * size], k) for j, name in enumerate(route.names)
        ]
    mt = mask.T
    counts = mt.sum(axis=1)
    buf = rec[mt].tobytes()
    out = []
    pos = 0
    for j, c in enumerate(counts.tolist()):
        if c:
            out.append(Message(route.names[j], buf[pos : pos + 16 * c], c))
            pos += 16 * c
    return out


def encode(
    fmt: Format,
    route: Route,
    ts: Int64Array,
    values: Float64Array,
    mask: BoolArray | None,
    max_bytes: int = 1 << 20,
) -> list[Message]:
    if fmt == "dcdb":
        return encode_dcdb(route, ts, values, mask)
    return encode_kvb1(route, ts, values, mask, max_bytes)


def metadata_message(meta: SensorMetadata) -> Message:
    topic, payload = codec.encode_metadata(meta)
    return Message(topic, payload, 0)
