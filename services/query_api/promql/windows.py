"""Range-vector functions (``rate``, ``*_over_time``, ...) over every window of a query at once.

Prometheus computes each window with a loop over its samples. Here all windows
(series x steps) advance together: :class:`Scan` walks the k-th sample of every
window in one numpy operation, so the arithmetic is Prometheus' own, in its order
(Kahan-Neumaier sums included), and a window after a 1e17 spike is summed as
exactly as any other. Counts use integer prefix sums (exact), minimum and maximum
a sparse table; no running float sum is ever differenced. Durations are integer
nanosecond differences before they become seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from services.query_api.promql import sums
from services.query_api.promql.ast import EvalError
from services.query_api.promql.values import B2, F1, F2, I1, Matrix

_GATHER = 1 << 18
"""Window samples gathered at once by :meth:`Scan.samples` (2 MB)."""
_TAME_MEAN = 1e307
"""Below this (and finite) a running mean cannot overflow: no infinity handling needed."""
_TAME_SQUARE = 1e150
"""Below this (and finite) squares and their sums over a window stay finite."""

Result = tuple[F1, np.ndarray]
"""Flat values and presence, one per window (series-major, as ``Matrix.lo.ravel()``)."""


class Scan:
    """The windows of a matrix, longest first, walked sample by sample."""

    def __init__(self, vs: np.ndarray, lo: I1, hi: I1) -> None:
        self.vs = vs
        self.n = hi - lo
        self.order = np.argsort(-self.n, kind="stable")
        self.lo = lo[self.order]
        n_sorted = self.n[self.order]
        self.k_max = int(n_sorted[0]) if n_sorted.shape[0] else 0
        # windows with more than k samples: a prefix of the sorted order
        self.active = np.searchsorted(-n_sorted, -np.arange(self.k_max), side="left")
        self.size = int(lo.shape[0])

    def samples(self, start: int = 0) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(k, m, values)``: the k-th sample of the first ``m`` (sorted) windows.

        Positions are gathered a block at a time (``_GATHER`` values), so a step costs
        only its arithmetic.
        """
        rows = max(1, _GATHER // max(self.size, 1))
        last = max(self.vs.shape[0] - 1, 0)
        for k0 in range(start, self.k_max, rows):
            k1 = min(k0 + rows, self.k_max)
            m0 = int(self.active[k0])
            idx = self.lo[None, :m0] + np.arange(k0, k1, dtype=np.int64)[:, None]
            np.minimum(idx, last, out=idx)  # past a window's end: unused
            block = self.vs[idx]
            for k in range(k0, k1):
                m = int(self.active[k])
                yield k, m, block[k - k0, :m]

    def unsort(self, sorted_values: F1) -> F1:
        out = np.empty(self.size)
        out[self.order] = sorted_values
        return out


def _tame(vs: F1, bound: float) -> bool:
    return vs.shape[0] == 0 or bool(np.isfinite(vs).all() and np.abs(vs).max() < bound)


def _kahan_finite(inc: F1, total: F1, c: F1) -> None:
    """:func:`_kahan` in place for finite sums that cannot overflow.

    Knuth's branch-free TwoSum gives the same exact error term as Neumaier's two
    branches (an exact error is one number), in fewer passes.
    """
    t = total + inc
    z = t - total
    err = total - (t - z)
    err += inc - z
    c += err
    total[...] = t


def _kahan(inc: F1, total: F1, c: F1) -> tuple[F1, F1]:
    """Prometheus' kahanSumInc (Neumaier's variant), element-wise."""
    t = total + inc
    big = np.abs(total) >= np.abs(inc)
    with np.errstate(invalid="ignore"):
        c = c + np.where(big, (total - t) + inc, (inc - t) + total)
    return t, c


def _sum(sc: Scan) -> F1:
    total, c = np.zeros(sc.size), np.zeros(sc.size)
    with np.errstate(invalid="ignore", over="ignore"):
        for _, m, x in sc.samples():
            total[:m], c[:m] = _kahan(x, total[:m], c[:m])
        return sc.unsort(np.where(np.isinf(total), total, total + c))


def _avg(sc: Scan) -> F1:
    if _tame(sc.vs, _TAME_MEAN):  # the mean stays finite: Prometheus' infinity cases never apply
        mean, c = np.zeros(sc.size), np.zeros(sc.size)
        for k, m, x in sc.samples():
            seen = float(k + 1)  # every window still going has seen k + 1 samples
            inc = x / seen
            inc -= mean[:m] / seen
            _kahan_finite(inc, mean[:m], c[:m])
        return sc.unsort(mean + c)
    mean, c, count = np.zeros(sc.size), np.zeros(sc.size), np.zeros(sc.size)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for _, m, x in sc.samples():
            count[:m] += 1
            mu = mean[:m]
            inf = np.isinf(mu)
            skip = inf & ((np.isinf(x) & ((mu > 0) == (x > 0))) | (~np.isinf(x) & ~np.isnan(x)))
            nm, nc = _kahan(x / count[:m] - mu / count[:m], mu, c[:m])
            mean[:m] = np.where(skip, mu, nm)
            c[:m] = np.where(skip, c[:m], nc)
        return sc.unsort(np.where(np.isinf(mean), mean, mean + c))


def _variance(sc: Scan) -> F1:
    if _tame(sc.vs, _TAME_SQUARE):
        mean, c_mean = np.zeros(sc.size), np.zeros(sc.size)
        aux, c_aux = np.zeros(sc.size), np.zeros(sc.size)
        n = np.zeros(sc.size)
        for k, m, x in sc.samples():
            n[:m] = k + 1
            delta = x - (mean[:m] + c_mean[:m])
            _kahan_finite(delta / float(k + 1), mean[:m], c_mean[:m])
            delta *= x - (mean[:m] + c_mean[:m])
            _kahan_finite(delta, aux[:m], c_aux[:m])
        return sc.unsort((aux + c_aux) / n)
    count = np.zeros(sc.size)
    mean, c_mean = np.zeros(sc.size), np.zeros(sc.size)
    aux, c_aux = np.zeros(sc.size), np.zeros(sc.size)
    with np.errstate(invalid="ignore", over="ignore"):
        for _, m, x in sc.samples():
            count[:m] += 1
            delta = x - (mean[:m] + c_mean[:m])
            mean[:m], c_mean[:m] = _kahan(delta / count[:m], mean[:m], c_mean[:m])
            aux[:m], c_aux[:m] = _kahan(delta * (x - (mean[:m] + c_mean[:m])), aux[:m], c_aux[:m])
        with np.errstate(divide="ignore"):
            return sc.unsort((aux + c_aux) / count)


def _extreme(vs: F1, lo: I1, hi: I1, largest: bool) -> F1:
    """Per-window max (or min) ignoring NaN unless all are NaN, from a sparse table."""
    pick = np.fmax if largest else np.fmin
    n = hi - lo
    out = np.full(lo.shape[0], np.nan)
    ok = n > 0
    if not bool(ok.any()):
        return out
    levels = [vs]
    width = 1
    longest = int(n.max())
    while width * 2 <= longest:
        prev = levels[-1]
        levels.append(pick(prev[:-width], prev[width:]))
        width *= 2
    lo_ok, n_ok = lo[ok], n[ok]
    j = np.floor(np.log2(n_ok)).astype(np.int64)
    res = np.empty(lo_ok.shape[0])
    for level in range(len(levels)):
        sel = j == level
        if bool(sel.any()):
            table = levels[level]
            a = lo_ok[sel]
            b = a + n_ok[sel] - (1 << level)
            res[sel] = pick(table[a], table[b])
    out[ok] = res
    return out


def _pair_counts(indicator: np.ndarray, lo: I1, hi: I1) -> F1:
    """How many pairs (i-1, i) inside each window have ``indicator[i]`` set (exact)."""
    c = np.zeros(indicator.shape[0] + 1, dtype=np.int64)
    np.cumsum(indicator, out=c[1:])
    first = np.minimum(lo + 1, hi)
    return (c[hi] - c[first]).astype(np.float64)


def _seconds(ns: I1) -> F1:
    return ns.astype(np.float64) / 1e9


def range_seconds(range_ns: int) -> float:
    """Go's ``time.Duration.Seconds()`` (whole seconds plus the rest, as Prometheus divides)."""
    return float(range_ns // 1_000_000_000) + float(range_ns % 1_000_000_000) / 1e9


def extrapolated(m: Matrix, is_counter: bool, is_rate: bool) -> Result:
    """rate, increase, delta: Prometheus' extrapolatedRate."""
    lo, hi = m.lo.ravel(), m.hi.ravel()
    n = hi - lo
    ok = n >= 2
    out = np.full(lo.shape[0], np.nan)
    if not bool(ok.any()):
        return out, ok
    a, b = lo[ok], hi[ok] - 1
    vs, ts = m.vs, m.ts
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        result = vs[b] - vs[a]
        if is_counter:
            resets = np.flatnonzero(vs[1:] < vs[:-1]) + 1
            if resets.shape[0]:
                first = np.searchsorted(resets, a, side="right")
                last = np.searchsorted(resets, b, side="right")
                count = last - first
                drops = vs[resets - 1]
                for k in range(int(count.max())):
                    more = count > k
                    result[more] = result[more] + drops[first[more] + k]
        ends = np.repeat(m.ends[None, :], m.lo.shape[0], axis=0).ravel()[ok]
        to_start = _seconds(ts[a] - (ends - m.range_ns))
        to_end = _seconds(ends - ts[b])
        sampled = _seconds(ts[b] - ts[a])
        avg_step = sampled / (n[ok] - 1).astype(np.float64)
        if is_counter:
            to_zero = sampled * (vs[a] / result)
            shrink = (result > 0) & (vs[a] >= 0) & (to_zero < to_start)
            to_start = np.where(shrink, to_zero, to_start)
        threshold = avg_step * 1.1
        interval = sampled + np.where(to_start < threshold, to_start, avg_step / 2)
        interval = interval + np.where(to_end < threshold, to_end, avg_step / 2)
        factor = interval / sampled
        if is_rate:
            factor = factor / range_seconds(m.range_ns)
        out[ok] = result * factor
    return out, ok


def instant_value(m: Matrix, is_rate: bool) -> Result:
    """irate, idelta: the last two samples of each window."""
    lo, hi = m.lo.ravel(), m.hi.ravel()
    ok = (hi - lo) >= 2
    out = np.full(lo.shape[0], np.nan)
    b = hi[ok] - 1
    a = b - 1
    last, prev = m.vs[b], m.vs[a]
    dt = m.ts[b] - m.ts[a]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        res = np.where(last < prev, last, last - prev) / _seconds(dt) if is_rate else last - prev
    out[ok] = res
    ok[ok] = dt != 0
    return out, ok


def _regression(m: Matrix, lo: I1, hi: I1, intercept_ns: I1 | None) -> tuple[F1, F1, np.ndarray]:
    """Least squares slope and intercept per window, as Prometheus' linearRegression."""
    ok = (hi - lo) >= 2
    size = lo.shape[0]
    slope, icpt = np.full(size, np.nan), np.full(size, np.nan)
    if not bool(ok.any()):
        return slope, icpt, ok
    lo_ok, hi_ok = lo[ok], hi[ok]
    origin = m.ts[lo_ok] if intercept_ns is None else intercept_ns[ok]
    sc = Scan(m.vs, lo_ok, hi_ok)
    order_origin = origin[sc.order]
    first_v = m.vs[sc.lo]
    k = sc.size
    sx, cx, sy, cy = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    sxy, cxy, sx2, cx2 = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    const = np.ones(k, dtype=bool)
    count = sc.n[sc.order].astype(np.float64)
    times = Scan(m.ts, lo_ok, hi_ok)  # the same windows in the same order
    tame = _tame(m.vs, _TAME_SQUARE)  # products and sums stay finite
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for (i, mm, y), (_, _, t) in zip(sc.samples(), times.samples(), strict=True):
            if i > 0:
                const[:mm] &= y == first_v[:mm]
            x = _seconds(t - order_origin[:mm])
            if tame:
                xy, xx = x * y, x * x
                _kahan_finite(x, sx[:mm], cx[:mm])
                _kahan_finite(y, sy[:mm], cy[:mm])
                _kahan_finite(xy, sxy[:mm], cxy[:mm])
                _kahan_finite(xx, sx2[:mm], cx2[:mm])
                continue
            sx[:mm], cx[:mm] = _kahan(x, sx[:mm], cx[:mm])
            sy[:mm], cy[:mm] = _kahan(y, sy[:mm], cy[:mm])
            sxy[:mm], cxy[:mm] = _kahan(x * y, sxy[:mm], cxy[:mm])
            sx2[:mm], cx2[:mm] = _kahan(x * x, sx2[:mm], cx2[:mm])
        sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
        cov = sxy - sx * sy / count
        var = sx2 - sx * sx / count
        s = cov / var
        it = sy / count - s * sx / count
        inf_first = np.isinf(first_v)
        s = np.where(const, np.where(inf_first, np.nan, 0.0), s)
        it = np.where(const, np.where(inf_first, np.nan, first_v), it)
    slope[ok] = sc.unsort(s)
    icpt[ok] = sc.unsort(it)
    return slope, icpt, ok


def deriv(m: Matrix) -> Result:
    slope, _, ok = _regression(m, m.lo.ravel(), m.hi.ravel(), None)
    return slope, ok


def predict_linear(m: Matrix, steps: I1, duration: F1) -> Result:
    rows = m.lo.shape[0]
    at = np.repeat(steps[None, :], rows, axis=0).ravel()
    slope, icpt, ok = _regression(m, m.lo.ravel(), m.hi.ravel(), at)
    dur = np.repeat(duration[None, :], rows, axis=0).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        return slope * dur + icpt, ok


def holt_winters(m: Matrix, sf: F1, tf: F1) -> Result:
    lo, hi = m.lo.ravel(), m.hi.ravel()
    rows = m.lo.shape[0]
    called = (m.hi - m.lo) > 0
    steps_called = called.any(axis=0)
    bad_sf = steps_called & ~((sf > 0) & (sf < 1))
    if bool(bad_sf.any()):
        got = float(sf[np.flatnonzero(bad_sf)[0]])
        raise EvalError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {got:f}")
    bad_tf = steps_called & ~((tf > 0) & (tf < 1))
    if bool(bad_tf.any()):
        got = float(tf[np.flatnonzero(bad_tf)[0]])
        raise EvalError(f"invalid trend factor. Expected: 0 < tf < 1, got: {got:f}")
    ok = (hi - lo) >= 2
    out = np.full(lo.shape[0], np.nan)
    if not bool(ok.any()):
        return out, ok
    sc = Scan(m.vs, lo[ok], hi[ok])
    sfw = np.repeat(sf[None, :], rows, axis=0).ravel()[ok][sc.order]
    tfw = np.repeat(tf[None, :], rows, axis=0).ravel()[ok][sc.order]
    v0 = m.vs[sc.lo]
    s1 = v0.copy()
    b = m.vs[sc.lo + 1] - v0
    s0 = np.zeros(sc.size)
    with np.errstate(invalid="ignore", over="ignore"):
        if bool((sfw == sfw[0]).all() and (tfw == tfw[0]).all()):  # literal factors: scalars
            sf1, tf1 = float(sfw[0]), float(tfw[0])
            keep_s, keep_t = 1 - sf1, 1 - tf1
            for i, mm, x in sc.samples(start=1):
                s1m, bm = s1[:mm], b[:mm]
                if i > 1:
                    trend = s1m - s0[:mm]
                    trend *= tf1
                    bm *= keep_t
                    bm += trend
                y = s1m + bm
                y *= keep_s
                s0[:mm] = s1m
                y += sf1 * x
                s1m[...] = y
            out[ok] = sc.unsort(s1)
            return out, ok
        for i, mm, x in sc.samples(start=1):
            xs = sfw[:mm] * x
            if i > 1:
                b[:mm] = tfw[:mm] * (s1[:mm] - s0[:mm]) + (1 - tfw[:mm]) * b[:mm]
            y = (1 - sfw[:mm]) * (s1[:mm] + b[:mm])
            s0[:mm] = s1[:mm]
            s1[:mm] = xs + y
    out[ok] = sc.unsort(s1)
    return out, ok


def _blocks(n: I1) -> Iterator[tuple[I1, int]]:
    """Windows (indices, shortest first) in groups whose rows padded to the longest hold at
    most ``_GATHER`` samples, and that length."""
    order = np.argsort(n, kind="stable")
    ns = n[order]
    i, size = 0, int(ns.shape[0])
    while i < size:
        cost = np.arange(1, size - i + 1, dtype=np.int64) * ns[i:]
        j = i + max(1, int(np.searchsorted(cost, _GATHER, side="right")))
        yield order[i:j], int(ns[j - 1])
        i = j


def _nan_first(block: np.ndarray, nans: I1, pos: I1) -> F1:
    """Row ``r``'s value at ``pos[r]`` in Go's order (its ``nans[r]`` NaNs first) from numpy's."""
    at = np.arange(block.shape[0])
    return np.where(pos < nans, np.nan, block[at, np.maximum(pos - nans, 0)])


def quantile_over_time(m: Matrix, q: F1) -> Result:
    """Each window sorted on its own (a block of windows per ``np.sort``), NaN first as in Go."""
    lo, hi = m.lo.ravel(), m.hi.ravel()
    rows = m.lo.shape[0]
    n = hi - lo
    ok = n > 0
    out = np.full(lo.shape[0], np.nan)
    if not bool(ok.any()):
        return out, ok
    qw = np.repeat(q[None, :], rows, axis=0).ravel()[ok]
    lo_ok, n_ok = lo[ok], n[ok]
    res = np.empty(n_ok.shape[0])
    last = m.vs.shape[0] - 1
    for sel, width in _blocks(n_ok):
        cols = np.arange(width, dtype=np.int64)
        real = cols[None, :] < n_ok[sel][:, None]
        block = m.vs[np.minimum(lo_ok[sel][:, None] + cols[None, :], last)]
        block[~real] = np.inf  # padding sorts after every real value but NaN
        nans = np.isnan(block).sum(axis=1)
        block.sort(axis=1)  # NaN last; Prometheus' order is these rows rotated by `nans`
        nf = n_ok[sel].astype(np.float64)
        qs = qw[sel]
        with np.errstate(invalid="ignore"):
            rank = qs * (nf - 1)
            lower = np.maximum(0, np.floor(rank))
            upper = np.minimum(nf - 1, lower + 1)
            weight = rank - np.floor(rank)
            top = nf - 1
            li = np.clip(np.nan_to_num(lower), 0, top).astype(np.int64)
            ui = np.clip(np.nan_to_num(upper), 0, top).astype(np.int64)
            got = _nan_first(block, nans, li) * (1 - weight) + _nan_first(block, nans, ui) * weight
        res[sel] = np.where(
            np.isnan(qs), np.nan, np.where(qs < 0, -np.inf, np.where(qs > 1, np.inf, got))
        )
    out[ok] = res
    return out, ok


def over_time(name: str, m: Matrix) -> Result:
    """The aggregations over time that take nothing but the range vector."""
    lo, hi = m.lo.ravel(), m.hi.ravel()
    n = hi - lo
    ok = n > 0
    if name == "count_over_time":
        return n.astype(np.float64), ok
    if name == "present_over_time":
        return np.ones(lo.shape[0]), ok
    if name == "last_over_time":
        return m.vs[np.maximum(hi - 1, 0)] if m.vs.shape[0] else np.full(lo.shape[0], np.nan), ok
    if name in ("max_over_time", "min_over_time"):
        return _extreme(m.vs, lo, hi, name == "max_over_time"), ok
    if name == "changes":
        vs = m.vs
        ind = np.zeros(vs.shape[0], dtype=np.int64)
        if vs.shape[0] > 1:
            ind[1:] = (vs[1:] != vs[:-1]) & ~(np.isnan(vs[1:]) & np.isnan(vs[:-1]))
        return _pair_counts(ind, lo, hi), ok
    if name == "resets":
        vs = m.vs
        ind = np.zeros(vs.shape[0], dtype=np.int64)
        if vs.shape[0] > 1:
            ind[1:] = vs[1:] < vs[:-1]
        return _pair_counts(ind, lo, hi), ok
    out = np.full(lo.shape[0], np.nan)
    if not bool(ok.any()):
        return out, ok
    if name == "sum_over_time":
        exact = sums.exact_window_sums(m.vs, lo[ok], hi[ok])
        if exact is not None:
            out[ok] = exact
            return out, ok
    sc = Scan(m.vs, lo[ok], hi[ok])
    if name == "sum_over_time":
        out[ok] = _sum(sc)
    elif name == "avg_over_time":
        out[ok] = _avg(sc)
    elif name == "stdvar_over_time":
        out[ok] = _variance(sc)
    elif name == "stddev_over_time":
        with np.errstate(invalid="ignore"):
            out[ok] = np.sqrt(_variance(sc))
    else:
        raise AssertionError(name)
    return out, ok


def shaped(m: Matrix, result: Result) -> tuple[F2, B2]:
    values, ok = result
    shape = m.lo.shape
    return values.reshape(shape), np.asarray(ok, dtype=bool).reshape(shape)
