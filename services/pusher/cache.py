"""The pusher's sensor cache: recent readings of every sensor, for latest values and averages.

DCDB's ``cacheInterval``. A group's sensors are sampled on the same instants,
so they share one **block**: a ring of timestamps and a ring of value rows (one
``array('d')`` of ``points x n`` floats), written one row per cycle with a
single slice assignment: 8 bytes per reading and no Python loop per sensor.
NaN marks "no reading this cycle". The memory a full window needs is
allocated and touched up front, so RSS shows the steady state from the start.

The collect agent has its own cache (:mod:`services.common.cache`, numpy);
this one needs only the standard library, so a pusher on a compute node does
not load numpy.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class CachedValue:
    sensor: str
    timestamp_ns: int
    value: float


class Block:
    """Sensors sampled together: shared timestamps, one value column per sensor."""

    __slots__ = ("cap", "n", "names", "pos", "rows", "ts", "width")

    def __init__(self, names: list[str], cap: int) -> None:
        self.names = names
        self.cap = cap
        self.width = len(names)
        self.ts = array("q", bytes(8 * cap))
        self.rows = array("d", [_NAN]) * (cap * self.width)
        self.pos = 0
        """Next row to write."""
        self.n = 0
        """Rows written (up to ``cap``)."""

    def put_row(self, ts: int, row: Sequence[float]) -> None:
        w = self.width
        start = self.pos * w
        self.rows[start : start + w] = row if isinstance(row, array) else array("d", row)
        self.ts[self.pos] = ts
        self.pos = (self.pos + 1) % self.cap
        self.n = min(self.cap, self.n + 1)

    def _order(self) -> list[int]:
        """Row indices, oldest first."""
        start = (self.pos - self.n) % self.cap
        return [(start + i) % self.cap for i in range(self.n)]

    def column(self, j: int) -> tuple[list[int], list[float]]:
        """A sensor's readings, oldest first, without the cycles it had none."""
        w = self.width
        ts, vs = [], []
        for i in self._order():
            v = self.rows[i * w + j]
            if v == v:
                ts.append(self.ts[i])
                vs.append(v)
        return ts, vs

    def latest(self, j: int) -> tuple[int, float] | None:
        w = self.width
        for back in range(1, self.n + 1):  # the newest row almost always holds it
            i = (self.pos - back) % self.cap
            v = self.rows[i * w + j]
            if v == v:
                return self.ts[i], v
        return None


class SensorCache:
    """Latest value and time-weighted averages of recent readings per sensor."""

    def __init__(self, window_s: float = 900.0, max_points: int = 1024) -> None:
        self.window_ns = int(window_s * 1e9)
        self.max_points = max_points
        self._cols: dict[str, tuple[Block, int]] = {}
        self._blocks: dict[int, Block] = {}
        self._next_block = 0

    def __len__(self) -> int:
        return len(self._cols)

    def __contains__(self, sensor: str) -> bool:
        return sensor in self._cols

    def sensors(self) -> list[str]:
        return sorted(self._cols)

    def points_for(self, interval_s: float) -> int:
        """Points that cover the window at one reading per ``interval_s``, capped."""
        if interval_s <= 0:
            return self.max_points
        return max(2, min(self.max_points, int(self.window_ns / 1e9 / interval_s) + 1))

    def add_block(self, sensors: list[str], points: int) -> int:
        """Cache ``sensors`` together (sampled on the same instants); returns a handle."""
        taken = [s for s in sensors if s in self]
        if taken:
            raise ValueError(f"sensor(s) already cached: {', '.join(taken[:5])}")
        block = Block(list(sensors), max(2, min(points, self.max_points)))
        handle = self._next_block
        self._next_block += 1
        self._blocks[handle] = block
        for j, name in enumerate(block.names):
            self._cols[name] = (block, j)
        return handle

    def put_row(self, handle: int, timestamp_ns: int, values: Sequence[float]) -> None:
        """One cycle of a block: a value per sensor, NaN where a sensor has no reading."""
        self._blocks[handle].put_row(timestamp_ns, values)

    def drop_block(self, handle: int) -> None:
        block = self._blocks.pop(handle, None)
        if block is not None:
            for name in block.names:
                self._cols.pop(name, None)

    def _series(self, sensor: str) -> tuple[list[int], list[float]]:
        col = self._cols.get(sensor)
        if col is None:
            return [], []
        return col[0].column(col[1])

    def latest(self, sensor: str) -> CachedValue | None:
        col = self._cols.get(sensor)
        found = col[0].latest(col[1]) if col is not None else None
        return None if found is None else CachedValue(sensor, *found)

    def readings(self, sensor: str, since_ns: int | None = None) -> tuple[list[int], list[float]]:
        """Cached readings, oldest first, within the cache window (and after ``since_ns``)."""
        ts, vs = self._series(sensor)
        if not ts:
            return ts, vs
        lo = ts[-1] - self.window_ns
        if since_ns is not None:
            lo = max(lo, since_ns)
        i = bisect_left(ts, lo)
        return ts[i:], vs[i:]

    def average(self, sensor: str, seconds: float) -> float | None:
        """Time-weighted average over the last ``seconds`` (up to the newest reading).

        Each reading holds until the next one (step interpolation), as DCDB does;
        a reading older than the window start contributes from the start onwards.
        """
        ts, vs = self._series(sensor)
        if not ts:
            return None
        end = ts[-1]
        start = end - int(seconds * 1e9)
        i = max(bisect_right(ts, start) - 1, 0)
        j = bisect_right(ts, end)
        t = [float(x) for x in ts[i:j]]
        v = vs[i:j]
        if len(t) == 1 or end <= start:
            return float(v[-1])
        t[0] = max(t[0], float(start))
        durations = [b - a for a, b in zip(t, [*t[1:], float(end)], strict=True)]
        total = math.fsum(durations)
        if total <= 0:
            return float(v[-1])
        return math.fsum(d * x for d, x in zip(durations, v, strict=True)) / total
