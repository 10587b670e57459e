"""Putting inputs of different rates onto one grid: linear interpolation that respects gaps.

The grid of a virtual sensor is every multiple of its interval since the epoch,
so any two evaluations of overlapping ranges produce the same points (stored
results can be stitched together). A grid point between two readings gets the
straight line between them, unless they are more than ``max_gap_ns`` apart: a
gap stays a gap (NaN). A grid point that coincides with a reading gets that
reading. Nothing is extrapolated beyond the first or last reading.
"""

from __future__ import annotations

import numpy as np

from services.common.readings import Float64Array, Int64Array


def first_grid_point(start_ns: int, interval_ns: int) -> int:
    """The smallest multiple of ``interval_ns`` at or after ``start_ns``."""
    return -((-start_ns) // interval_ns) * interval_ns


def grid(start_ns: int, end_ns: int, interval_ns: int) -> Int64Array:
    """Grid points in ``[start_ns, end_ns)``."""
    first = first_grid_point(start_ns, interval_ns)
    if first >= end_ns:
        return np.empty(0, dtype=np.int64)
    return np.arange(first, end_ns, interval_ns, dtype=np.int64)


def interpolate(
    ts_ns: Int64Array, values: Float64Array, at_ns: Int64Array, max_gap_ns: int
) -> Float64Array:
    """Values of the series at ``at_ns`` (see module docstring). NaN readings are gaps."""
    out = np.full(at_ns.shape[0], np.nan)
    ok = ~np.isnan(values)
    if not bool(ok.all()):
        ts_ns, values = ts_ns[ok], values[ok]
    n = ts_ns.shape[0]
    if n == 0 or at_ns.shape[0] == 0:
        return out
    right = np.searchsorted(ts_ns, at_ns, side="left")
    exact = right < n
    exact[exact] = ts_ns[right[exact]] == at_ns[exact]
    inner = (right > 0) & (right < n) & ~exact
    if bool(inner.any()):
        r = right[inner]
        t0, t1 = ts_ns[r - 1], ts_ns[r]
        span = t1 - t0
        usable = span <= max_gap_ns
        frac = (at_ns[inner] - t0) / span
        v0, v1 = values[r - 1], values[r]
        out_inner = np.where(usable, v0 + (v1 - v0) * frac, np.nan)
        out[inner] = out_inner
    out[exact] = values[right[exact]]
    return out


def typical_interval_ns(ts_ns: Int64Array) -> int | None:
    """The median step between readings, or None with fewer than two readings."""
    if ts_ns.shape[0] < 2:
        return None
    step = int(np.median(np.diff(ts_ns)))
    return step if step > 0 else None
