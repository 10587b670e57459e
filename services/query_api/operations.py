"""DCDB's sensor operations and interval resampling, vectorised with numpy.

Transforms give one point per step between two consecutive readings, stamped
with the later reading (as DCDB's ``dcdbquery`` prints them):

=============  =====================================  ============
operation      value at reading *i* (i >= 1)           unit
=============  =====================================  ============
``delta``      v[i] - v[i-1]                           unit [#]_
``delta_t``    t[i] - t[i-1] (ns)                      ns
``derivative`` (v[i] - v[i-1]) / dt (dt in s)          unit/s
``integral``   (v[i] + v[i-1]) / 2 * dt (trapezoid)    unit·s
``rate``       increase of a counter / dt; a drop is   unit/s
               a reset, so the increase is v[i]
=============  =====================================  ============

.. [#] a difference of a unit with an offset is its ``delta_`` unit (``degC`` ->
   ``delta_degC``), which converts to ``K`` or ``delta_degF`` without the offset.

The sum of ``integral`` over a range is the trapezoidal integral of the range.
Aggregates (``min max avg sum count``) reduce the whole range to one point
stamped with the range start, or each ``interval`` bucket (aligned to multiples
of the interval since the epoch) to one point stamped with the bucket start.
Missing values (NaN) never enter an aggregate; empty buckets are left out.
"""

from __future__ import annotations

import numpy as np

from services.common.readings import Float64Array, Int64Array
from services.query_api import units
from services.query_api.spec import AGGREGATES, TRANSFORMS

NS_PER_S = 1e9

BUCKET_AGGREGATES = (*AGGREGATES, "first", "last")


def transform(op: str, ts: Int64Array, vs: Float64Array) -> tuple[Int64Array, Float64Array]:
    """Apply one transform (see module docstring)."""
    if op not in TRANSFORMS:
        raise ValueError(f"unknown transform {op!r}; expected one of {', '.join(TRANSFORMS)}")
    if ts.shape[0] < 2:
        return ts[:0], vs[:0]
    dt_ns = np.diff(ts)
    out_ts = ts[1:]
    if op == "delta":
        return out_ts, np.diff(vs)
    if op == "delta_t":
        return out_ts, dt_ns.astype(np.float64)
    dt_s = dt_ns / NS_PER_S
    if op == "derivative":
        return out_ts, np.diff(vs) / dt_s
    if op == "integral":
        return out_ts, (vs[1:] + vs[:-1]) * 0.5 * dt_s
    # rate: a counter that drops was reset and counted up from zero since
    inc = np.diff(vs)
    reset = inc < 0
    inc[reset] = vs[1:][reset]
    return out_ts, inc / dt_s


def transform_unit(op: str, unit: str) -> str:
    """The unit of ``op`` applied to a series in ``unit`` (text; '' = dimensionless)."""
    if op == "delta_t":
        return "ns"
    if op in ("derivative", "rate"):
        return f"{unit}/s" if unit else "1/s"
    if op == "integral":
        return f"{unit}*s" if unit else "s"
    if op == "delta":
        return units.difference_of(unit)  # degC -> delta_degC: converts without the offset
    return unit


def aggregate_unit(op: str, unit: str) -> str:
    return "" if op == "count" else unit


def aggregate(
    op: str,
    ts: Int64Array,
    vs: Float64Array,
    start_ns: int,
    interval_ns: int | None = None,
) -> tuple[Int64Array, Float64Array]:
    """Reduce the series to one point (``interval_ns`` None) or one per non-empty bucket."""
    if op not in BUCKET_AGGREGATES:
        raise ValueError(
            f"unknown aggregate {op!r}; expected one of {', '.join(BUCKET_AGGREGATES)}"
        )
    finite = ~np.isnan(vs)
    if not bool(finite.all()):
        ts, vs = ts[finite], vs[finite]
    if interval_ns is None:
        if ts.shape[0] == 0:
            if op == "count":
                return np.array([start_ns], dtype=np.int64), np.zeros(1)
            return ts, vs
        return np.array([start_ns], dtype=np.int64), np.array([_reduce_all(op, vs)])
    if ts.shape[0] == 0:
        return ts, vs
    buckets = ts // interval_ns  # floor division aligns to the epoch for negative times too
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    out_ts = (buckets[starts] * interval_ns).astype(np.int64)
    counts = np.diff(np.r_[starts, ts.shape[0]])
    if op == "count":
        return out_ts, counts.astype(np.float64)
    if op == "first":
        return out_ts, vs[starts]
    if op == "last":
        return out_ts, vs[starts + counts - 1]
    if op == "min":
        return out_ts, np.minimum.reduceat(vs, starts)
    if op == "max":
        return out_ts, np.maximum.reduceat(vs, starts)
    sums = np.add.reduceat(vs, starts)
    return out_ts, sums if op == "sum" else sums / counts


def _reduce_all(op: str, vs: Float64Array) -> float:
    if op == "count":
        return float(vs.shape[0])
    if op == "first":
        return float(vs[0])
    if op == "last":
        return float(vs[-1])
    if op == "min":
        return float(np.min(vs))
    if op == "max":
        return float(np.max(vs))
    if op == "sum":
        return float(np.sum(vs))
    return float(np.mean(vs))
