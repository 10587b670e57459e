"""Sensor cache: the recent readings of every sensor, for latest values and averages.

Used by the pusher and the collect agent (DCDB's ``cacheInterval``). One ring
buffer per sensor covering ``window_s`` seconds; memory is bounded by
``max_points`` per sensor, whatever the rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.common.readings import Batch, Float64Array, Int64Array


@dataclass(frozen=True, slots=True)
class CachedValue:
    sensor: str
    timestamp_ns: int
    value: float


class _Ring:
    __slots__ = ("cap", "n", "pos", "ts", "vs")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.ts: Int64Array = np.empty(cap, dtype=np.int64)
        self.vs: Float64Array = np.empty(cap, dtype=np.float64)
        self.pos = 0  # next write index
        self.n = 0

    def put(self, ts: Int64Array, vs: Float64Array) -> None:
        k = ts.shape[0]
        if k >= self.cap:
            self.ts[:] = ts[-self.cap :]
            self.vs[:] = vs[-self.cap :]
            self.pos, self.n = 0, self.cap
            return
        end = self.pos + k
        if end <= self.cap:
            self.ts[self.pos : end] = ts
            self.vs[self.pos : end] = vs
        else:
            first = self.cap - self.pos
            self.ts[self.pos :] = ts[:first]
            self.vs[self.pos :] = vs[:first]
            self.ts[: k - first] = ts[first:]
            self.vs[: k - first] = vs[first:]
        self.pos = end % self.cap
        self.n = min(self.cap, self.n + k)

    def ordered(self) -> tuple[Int64Array, Float64Array]:
        if self.n < self.cap:
            start = (self.pos - self.n) % self.cap
            if start + self.n <= self.cap:
                return self.ts[start : start + self.n], self.vs[start : start + self.n]
        idx = (np.arange(self.n) + (self.pos - self.n)) % self.cap
        return self.ts[idx], self.vs[idx]

    def latest(self) -> tuple[int, float]:
        i = (self.pos - 1) % self.cap
        return int(self.ts[i]), float(self.vs[i])


class SensorCache:
    """Latest value and time-weighted averages of recent readings per sensor."""

    def __init__(self, window_s: float = 900.0, max_points: int = 1024) -> None:
        self.window_ns = int(window_s * 1e9)
        self.max_points = max_points
        self._rings: dict[str, _Ring] = {}

    def __len__(self) -> int:
        return len(self._rings)

    def __contains__(self, sensor: str) -> bool:
        return sensor in self._rings

    def sensors(self) -> list[str]:
        return sorted(self._rings)

    def reserve(self, sensor: str, points: int) -> None:
        """Size one sensor's ring (e.g. window / interval) instead of ``max_points``."""
        points = max(2, min(points, self.max_points))
        if sensor not in self._rings or self._rings[sensor].cap != points:
            self._rings[sensor] = _Ring(points)

    def put(self, sensor: str, timestamps_ns: Int64Array, values: Float64Array) -> None:
        if timestamps_ns.shape[0] == 0:
            return
        ring = self._rings.get(sensor)
        if ring is None:
            ring = self._rings[sensor] = _Ring(self.max_points)
        ring.put(timestamps_ns, values)

    def put_batch(self, batch: Batch) -> None:
        off = batch.offsets
        for i, name in enumerate(batch.sensors):
            a, b = off[i], off[i + 1]
            if b > a:
                self.put(name, batch.timestamps_ns[a:b], batch.values[a:b])

    def forget(self, sensor: str) -> None:
        self._rings.pop(sensor, None)

    def latest(self, sensor: str) -> CachedValue | None:
        ring = self._rings.get(sensor)
        if ring is None or ring.n == 0:
            return None
        ts, v = ring.latest()
        return CachedValue(sensor, ts, v)

    def readings(self, sensor: str, since_ns: int | None = None) -> tuple[Int64Array, Float64Array]:
        """Cached readings, oldest first, within the cache window (and after ``since_ns``)."""
        ring = self._rings.get(sensor)
        if ring is None or ring.n == 0:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        ts, vs = ring.ordered()
        lo = ts[-1] - self.window_ns
        if since_ns is not None:
            lo = max(lo, since_ns)
        i = int(np.searchsorted(ts, lo, side="left"))
        return ts[i:], vs[i:]

    def average(self, sensor: str, seconds: float, now_ns: int | None = None) -> float | None:
        """Time-weighted average over the last ``seconds`` (up to the newest reading).

        Each reading holds until the next one (step interpolation), as DCDB does;
        a reading older than the window start contributes from the start onwards.
        """
        ring = self._rings.get(sensor)
        if ring is None or ring.n == 0:
            return None
        ts, vs = ring.ordered()
        end = int(ts[-1]) if now_ns is None else min(now_ns, int(ts[-1]))
        start = end - int(seconds * 1e9)
        i = int(np.searchsorted(ts, start, side="right")) - 1
        i = max(i, 0)
        t = ts[i:].astype(np.float64)
        v = vs[i:]
        if t.shape[0] == 1 or end <= start:
            return float(v[-1])
        t = t.copy()
        t[0] = max(t[0], start)
        durations = np.diff(np.append(t, end))
        total = float(durations.sum())
        if total <= 0:
            return float(v[-1])
        return float((durations * v).sum() / total)
