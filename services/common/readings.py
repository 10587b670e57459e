"""The reading model: columnar batches of (sensor, timestamp ns, value) readings.

Every hop of the pipeline (decoder -> spool -> writer -> storage, and storage
-> query API) moves readings as a :class:`Batch`: one list of sensor names and
three numpy arrays, so that no per-reading Python object is ever created.
Timestamps are int64 nanoseconds since the Unix epoch (UTC); values are
float64 physical values (DCDB integers already multiplied by their scale).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

TS_DTYPE = np.dtype(np.int64)
VALUE_DTYPE = np.dtype(np.float64)

Int64Array = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]

_EMPTY_TS: Int64Array = np.empty(0, dtype=np.int64)
_EMPTY_VALUES: Float64Array = np.empty(0, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Series:
    """The readings of one sensor: equal-length timestamp and value arrays."""

    sensor: str
    timestamps_ns: Int64Array
    values: Float64Array

    def __len__(self) -> int:
        return int(self.timestamps_ns.shape[0])

    @classmethod
    def empty(cls, sensor: str) -> Series:
        return cls(sensor, _EMPTY_TS, _EMPTY_VALUES)


@dataclass(frozen=True, slots=True)
class Batch:
    """Readings of many sensors, columnar.

    Series ``i`` is ``sensors[i]`` with readings ``[offsets[i], offsets[i+1])``
    of ``timestamps_ns`` and ``values``. A sensor may appear more than once.
    """

    sensors: Sequence[str]
    offsets: Int64Array
    timestamps_ns: Int64Array
    values: Float64Array

    def __post_init__(self) -> None:
        if self.offsets.shape[0] != len(self.sensors) + 1:
            raise ValueError(
                f"offsets has {self.offsets.shape[0]} entries; expected len(sensors)+1 = "
                f"{len(self.sensors) + 1}"
            )
        if self.timestamps_ns.shape != self.values.shape:
            raise ValueError(
                f"timestamps ({self.timestamps_ns.shape}) and values ({self.values.shape}) differ"
            )
        if int(self.offsets[-1]) != self.timestamps_ns.shape[0]:
            raise ValueError("offsets[-1] must equal the number of readings")

    def __len__(self) -> int:
        """Number of readings (not of sensors)."""
        return int(self.timestamps_ns.shape[0])

    @property
    def series_count(self) -> int:
        return len(self.sensors)

    @property
    def counts(self) -> Int64Array:
        return np.diff(self.offsets)

    def series(self, i: int) -> Series:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return Series(self.sensors[i], self.timestamps_ns[a:b], self.values[a:b])

    def __iter__(self) -> Iterator[Series]:
        for i in range(len(self.sensors)):
            yield self.series(i)

    def sensor_per_reading(self) -> npt.NDArray[np.int64]:
        """Index into ``sensors`` for every reading (for vectorised grouping)."""
        return np.repeat(np.arange(len(self.sensors), dtype=np.int64), self.counts)

    @classmethod
    def empty(cls) -> Batch:
        return cls([], np.zeros(1, dtype=np.int64), _EMPTY_TS, _EMPTY_VALUES)

    @classmethod
    def single(cls, sensor: str, timestamps_ns: npt.ArrayLike, values: npt.ArrayLike) -> Batch:
        ts = np.ascontiguousarray(timestamps_ns, dtype=np.int64).reshape(-1)
        vs = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        return cls([sensor], np.array([0, ts.shape[0]], dtype=np.int64), ts, vs)

    @classmethod
    def from_series(cls, series: Iterable[Series]) -> Batch:
        items = list(series)
        if not items:
            return cls.empty()
        counts = np.fromiter((len(s) for s in items), dtype=np.int64, count=len(items))
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ts = np.concatenate([s.timestamps_ns for s in items]).astype(np.int64, copy=False)
        vs = np.concatenate([s.values for s in items]).astype(np.float64, copy=False)
        return cls([s.sensor for s in items], offsets, ts, vs)

    @classmethod
    def from_rows(
        cls, sensors: Sequence[str], timestamps_ns: npt.ArrayLike, values: npt.ArrayLike
    ) -> Batch:
        """One reading per sensor entry (sensors may repeat)."""
        ts = np.ascontiguousarray(timestamps_ns, dtype=np.int64).reshape(-1)
        vs = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        if len(sensors) != ts.shape[0]:
            raise ValueError("from_rows needs one sensor per reading")
        return cls(list(sensors), np.arange(len(sensors) + 1, dtype=np.int64), ts, vs)

    @classmethod
    def concat(cls, batches: Iterable[Batch]) -> Batch:
        items = [b for b in batches if b.series_count]
        if not items:
            return cls.empty()
        if len(items) == 1:
            return items[0]
        sensors: list[str] = []
        offsets = [np.zeros(1, dtype=np.int64)]
        base = 0
        for b in items:
            sensors.extend(b.sensors)
            offsets.append(b.offsets[1:] + base)
            base += len(b)
        return cls(
            sensors,
            np.concatenate(offsets),
            np.concatenate([b.timestamps_ns for b in items]),
            np.concatenate([b.values for b in items]),
        )


def sort_dedup(ts: Int64Array, vs: Float64Array) -> tuple[Int64Array, Float64Array]:
    """Sort by timestamp; for equal timestamps keep the last value given."""
    if ts.shape[0] < 2:
        return ts, vs
    if bool(np.all(ts[1:] > ts[:-1])):
        return ts, vs
    order = np.argsort(ts, kind="stable")
    ts, vs = ts[order], vs[order]
    keep = np.ones(ts.shape[0], dtype=bool)
    keep[:-1] = ts[1:] != ts[:-1]
    return ts[keep], vs[keep]
