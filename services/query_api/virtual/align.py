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
    ok = ~np.isnan(values)
    if not bool(ok.all()):
        ts_ns, values = ts_ns[ok], values[ok]
    n, m = ts_ns.shape[0], at_ns.shape[0]
    if n == 0 or m == 0:
        return np.full(m, np.nan)
    # np.interp works in float64: relative to the first reading, ns stay exact for 104 days
    base = ts_ns[0]
    out: Float64Array = np.interp(
        (at_ns - base).astype(np.float64), (ts_ns - base).astype(np.float64), values
    )
    out[(at_ns < ts_ns[0]) | (at_ns > ts_ns[-1])] = np.nan  # never extrapolate
    if n > 1 and bool((np.diff(ts_ns) > max_gap_ns).any()):
        r = np.clip(np.searchsorted(ts_ns, at_ns, side="left"), 1, n - 1)
        t0, t1 = ts_ns[r - 1], ts_ns[r]
        out[(t1 - t0 > max_gap_ns) & (at_ns != t0) & (at_ns != t1)] = np.nan
    return out


def typical_interval_ns(ts_ns: Int64Array) -> int | None:
    """The median step between readings, or None with fewer than two readings."""
    if ts_ns.shape[0] < 2:
        return None
    step = int(np.median(np.diff(ts_ns)))
    return step if step > 0 else None
