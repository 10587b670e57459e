"""Sensor cache: the recent readings of every sensor, for latest values and averages.

Used by the pusher and the collect agent (DCDB's ``cacheInterval``). Two layouts
behind one API, both bounded by ``max_points`` per sensor whatever the rate:

* a **ring per sensor** (:meth:`SensorCache.put`, :meth:`SensorCache.put_batch`)
  for readings that arrive sensor by sensor (collect agent): the rings of all
  sensors live in a few 2-D arrays (:mod:`services.common.rings`), so a batch of
  many sensors is written with a handful of numpy calls; a ring starts small and
  doubles up to its capacity, so a sparse sensor costs little;
* a **block** per group of sensors sampled together (:meth:`SensorCache.add_block`,
  :meth:`SensorCache.put_rows`): one timestamp ring shared by all of them and a
  2-D value ring, written one row per cycle with a single numpy assignment. NaN
  marks "no reading this cycle". A pusher group of 10k sensors costs 8 bytes per
  reading and no Python loop per sensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.common.readings import Batch, Float64Array, Int64Array
from services.common.rings import Rings

_EMPTY_TS: Int64Array = np.empty(0, np.int64)
_EMPTY_VS: Float64Array = np.empty(0, np.float64)


@dataclass(frozen=True, slots=True)
class CachedValue:
    sensor: str
    timestamp_ns: int
    value: float


def _ordered_slices(pos: int, n: int, cap: int) -> tuple[slice, slice | None]:
    """The one or two slices that hold the last ``n`` writes of a ring, oldest first."""
    start = (pos - n) % cap
    if start + n <= cap:
        return slice(start, start + n), None
    return slice(start, cap), slice(0, pos)


class _Block:
    """Sensors sampled together: shared timestamps, one value column per sensor."""

    __slots__ = ("cap", "n", "names", "pos", "ts", "vs")

    def __init__(self, names: list[str], cap: int) -> None:
        self.names = names
        self.cap = cap
        self.ts: Int64Array = np.zeros(cap, dtype=np.int64)
        # NaN-filled up front: the memory a full window needs is resident (and
        # visible in RSS) from the start, not after the window has elapsed.
        self.vs: Float64Array = np.full((cap, len(names)), np.nan, dtype=np.float64)
        self.pos = 0
        self.n = 0

    def put_rows(self, ts: Int64Array, vs: Float64Array) -> None:
        for i in range(ts.shape[0]):  # one row per sampling cycle: a handful at most
            self.ts[self.pos] = ts[i]
            self.vs[self.pos] = vs[i]
            self.pos = (self.pos + 1) % self.cap
        self.n = min(self.cap, self.n + ts.shape[0])

    def column(self, j: int) -> tuple[Int64Array, Float64Array]:
        a, b = _ordered_slices(self.pos, self.n, self.cap)
        if b is None:
            ts, vs = self.ts[a], self.vs[a, j]
        else:
            ts = np.concatenate((self.ts[a], self.ts[b]))
            vs = np.concatenate((self.vs[a, j], self.vs[b, j]))
        keep = ~np.isnan(vs)
        if bool(keep.all()):
            return ts, vs
        return ts[keep], vs[keep]

    def latest(self, j: int) -> tuple[int, float] | None:
        for back in range(1, self.n + 1):  # the newest row almost always holds it
            i = (self.pos - back) % self.cap
            v = self.vs[i, j]
            if v == v:
                return int(self.ts[i]), float(v)
        return None


class SensorCache:
    """Latest value and time-weighted averages of recent readings per sensor."""

    def __init__(self, window_s: float = 900.0, max_points: int = 1024) -> None:
        self.window_ns = int(window_s * 1e9)
        self.max_points = max_points
        self._rings = Rings(max_points)
        self._cols: dict[str, tuple[_Block, int]] = {}
        self._blocks: dict[int, _Block] = {}
        self._next_block = 0

    def __len__(self) -> int:
        return len(self._rings) + len(self._cols)

    def __contains__(self, sensor: str) -> bool:
        return sensor in self._rings.ids or sensor in self._cols

    def sensors(self) -> list[str]:
        return sorted([*self._rings.ids, *self._cols])

    def points_for(self, interval_s: float) -> int:
        """Points that cover the window at one reading per ``interval_s``, capped."""
        if interval_s <= 0:
            return self.max_points
        return max(2, min(self.max_points, int(self.window_ns / 1e9 / interval_s) + 1))

    def put(self, sensor: str, timestamps_ns: Int64Array, values: Float64Array) -> None:
        self.put_batch(Batch.single(sensor, timestamps_ns, values))

    def put_batch(self, batch: Batch) -> None:
        """Every reading of ``batch`` at once; a sensor may come more than once (arrival
        order is kept)."""
        if not len(batch):
            return
        if self._cols:
            blocked = [s for s in batch.sensors if s in self._cols]
            if blocked:
                raise ValueError(f"sensor {blocked[0]!r} is cached in a block; use put_rows")
        one_each = batch.series_count == len(batch)
        self._rings.put(
            batch.sensors, None if one_each else batch.counts, batch.timestamps_ns, batch.values
        )

    def add_block(self, sensors: list[str], points: int) -> int:
        """Cache ``sensors`` together (sampled on the same instants); returns a handle."""
        taken = [s for s in sensors if s in self]
        if taken:
            raise ValueError(f"sensor(s) already cached: {', '.join(taken[:5])}")
        block = _Block(list(sensors), max(2, min(points, self.max_points)))
        handle = self._next_block
        self._next_block += 1
        self._blocks[handle] = block
        for j, name in enumerate(block.names):
            self._cols[name] = (block, j)
        return handle

    def put_rows(self, handle: int, timestamps_ns: Int64Array, values: Float64Array) -> None:
        """Rows of a block: ``values`` is (k, n_sensors), NaN where a sensor has no reading."""
        self._blocks[handle].put_rows(timestamps_ns, values.reshape(timestamps_ns.shape[0], -1))

    def drop_block(self, handle: int) -> None:
        block = self._blocks.pop(handle, None)
        if block is not None:
            for name in block.names:
                self._cols.pop(name, None)

    def forget(self, sensor: str) -> None:
        self._rings.forget(sensor)

    def _series(self, sensor: str) -> tuple[Int64Array, Float64Array]:
        if sensor in self._rings.ids:
            return self._rings.ordered(sensor)
        col = self._cols.get(sensor)
        if col is None:
            return _EMPTY_TS, _EMPTY_VS
        return col[0].column(col[1])

    def latest(self, sensor: str) -> CachedValue | None:
        if sensor in self._rings.ids:
            got = self._rings.latest(sensor)
            return None if got is None else CachedValue(sensor, *got)
        col = self._cols.get(sensor)
        found = col[0].latest(col[1]) if col is not None else None
        return None if found is None else CachedValue(sensor, *found)

    def readings(self, sensor: str, since_ns: int | None = None) -> tuple[Int64Array, Float64Array]:
        """Cached readings, oldest first, within the cache window (and after ``since_ns``)."""
        ts, vs = self._series(sensor)
        if ts.shape[0] == 0:
            return ts, vs
        lo = int(ts[-1]) - self.window_ns
        if since_ns is not None:
            lo = max(lo, since_ns)
        i = int(np.searchsorted(ts, lo, side="left"))
        return ts[i:], vs[i:]

    def average(self, sensor: str, seconds: float) -> float | None:
        """Time-weighted average over the last ``seconds`` (up to the newest reading).

        Each reading holds until the next one (step interpolation), as DCDB does;
        a reading older than the window start contributes from the start onwards.
        """
        ts, vs = self._series(sensor)
        if ts.shape[0] == 0:
            return None
        end = int(ts[-1])
        start = end - int(seconds * 1e9)
        i = max(int(np.searchsorted(ts, start, side="right")) - 1, 0)
        j = int(np.searchsorted(ts, end, side="right"))
        t = ts[i:j].astype(np.float64)
        v = vs[i:j]
        if t.shape[0] == 1 or end <= start:
            return float(v[-1])
        t[0] = max(t[0], start)
        durations = np.diff(np.append(t, end))
        total = float(durations.sum())
        if total <= 0:
            return float(v[-1])
        return float((durations * v).sum() / total)
