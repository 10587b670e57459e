"""Range functions over all windows at once equal the same arithmetic done window by window.

The reference below walks each window's samples one at a time, as Prometheus'
functions do (Kahan-Neumaier sums, incremental means), in plain Python floats;
the vectorised results must be identical, bit for bit, whatever the values:
huge spikes, infinities, NaN.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.query_api.promql import windows
from services.query_api.promql.values import Matrix

S = 10**9


def kahan(inc: float, total: float, c: float) -> tuple[float, float]:
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def ref_sum(xs: list[float]) -> float:
    total = c = 0.0
    for x in xs:
        total, c = kahan(x, total, c)
    return total if math.isinf(total) else total + c


def ref_avg(xs: list[float]) -> float:
    mean = c = count = 0.0
    for x in xs:
        count += 1
        if math.isinf(mean):
            if math.isinf(x) and (mean > 0) == (x > 0):
                continue
            if not math.isinf(x) and not math.isnan(x):
                continue
        mean, c = kahan(x / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def ref_var(xs: list[float]) -> float:
    count = mean = cm = aux = ca = 0.0
    for x in xs:
        count += 1
        delta = x - (mean + cm)
        mean, cm = kahan(delta / count, mean, cm)
        aux, ca = kahan(delta * (x - (mean + cm)), aux, ca)
    return (aux + ca) / count


def ref_max(xs: list[float]) -> float:
    best = xs[0]
    for x in xs:
        if x > best or math.isnan(best):
            best = x
    return best


def matrix(vals: list[float], range_s: int) -> Matrix:
    ts = np.arange(len(vals), dtype=np.int64) * S
    ends = np.arange(-1, len(vals) + 2, dtype=np.int64) * S
    lo = np.searchsorted(ts, ends - range_s * S, side="left")[None, :].astype(np.int64)
    hi = np.searchsorted(ts, ends, side="right")[None, :].astype(np.int64)
    return Matrix([()], ts, np.asarray(vals, dtype=np.float64), lo, hi, ends, range_s * S)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


values = st.one_of(
    st.floats(-1e6, 1e6),
    st.sampled_from([1e17, -1e17, 1e300, math.inf, -math.inf, math.nan, 0.0, -0.0]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=1, max_size=30), st.integers(0, 8))
def test_window_aggregations_are_prometheus_arithmetic(vals: list[float], range_s: int) -> None:
    m = matrix(vals, range_s)
    refs = {"sum_over_time": ref_sum, "avg_over_time": ref_avg, "stdvar_over_time": ref_var,
            "max_over_time": ref_max}  # fmt: skip
    for name, ref in refs.items():
        got, ok = windows.over_time(name, m)
        for w in range(m.lo.shape[1]):
            xs = vals[int(m.lo[0, w]) : int(m.hi[0, w])]
            assert bool(ok[w]) == bool(xs), name
            if xs:
                assert same(float(got[w]), ref(xs)), (name, xs, got[w], ref(xs))


readings = st.one_of(
    st.floats(100, 400),  # full 53-bit mantissas in two binades
    st.floats(-40, 40).map(lambda x: round(x, 1)),
    st.integers(-(10**6), 10**6).map(float),
    st.just(0.0),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(readings, min_size=1, max_size=60), st.integers(0, 40))
def test_exact_integer_sums_are_prometheus_sums(vals: list[float], range_s: int) -> None:
    """Sensor-like readings take the integer prefix-sum path, and it gives Kahan's bits."""
    from services.query_api.promql import sums

    m = matrix(vals, range_s)
    lo, hi = m.lo.ravel(), m.hi.ravel()
    got = sums.exact_window_sums(m.vs, lo, hi)
    if max(map(abs, vals)) / min((abs(v) for v in vals if v), default=1.0) < 64:
        assert got is not None  # a narrow dynamic range is always provable
    if got is None:
        return
    for w in range(lo.shape[0]):
        xs = vals[int(lo[w]) : int(hi[w])]
        want = ref_sum(xs) if xs else 0.0
        assert float(got[w]) == want and math.copysign(1, got[w]) == math.copysign(1, want), (
            xs,
            got[w],
        )


@settings(max_examples=100, deadline=None)
@given(st.lists(readings, min_size=1, max_size=60), st.integers(0, 40))
def test_finite_means_and_variances_are_prometheus_arithmetic(
    vals: list[float], range_s: int
) -> None:
    """Finite readings take the means' and variances' branch-free path; same bits."""
    m = matrix(vals, range_s)
    for name, ref in {"avg_over_time": ref_avg, "stdvar_over_time": ref_var}.items():
        got, _ = windows.over_time(name, m)
        for w in range(m.lo.shape[1]):
            xs = vals[int(m.lo[0, w]) : int(m.hi[0, w])]
            if xs:
                assert same(float(got[w]), ref(xs)), (name, xs, got[w], ref(xs))


def test_a_spike_among_small_readings_is_not_summed_by_prefix() -> None:
    from services.query_api.promql import sums

    vs = np.array([1.1, 2.2, 1e17, 3.3])
    assert sums.exact_window_sums(vs, np.array([0, 3]), np.array([2, 4])) is None
    assert sums.exact_window_sums(np.array([1.0, math.inf]), np.array([0]), np.array([1])) is None


def test_a_huge_spike_leaves_later_windows_exact() -> None:
    """Issue 15: after a 1e17 reading, windows without it summed to 0 (a running sum's
    differences); each window is its own sum."""
    vals = [1.0, 2.0, 1e17, 3.0, 4.0, 5.0, 6.0]
    got, _ = windows.over_time("sum_over_time", matrix(vals, 1))
    sums = got.tolist()  # windows [t - 1 s, t] for t = -1 s ... 8 s
    assert sums[4] == 1e17 + 3.0
    assert sums[5:9] == [7.0, 9.0, 11.0, 6.0]


def test_rate_uses_integer_durations() -> None:
    """Durations come from int64 ns differences: a window 1 ns wide is not 0 s wide."""
    ts = np.array([10**18, 10**18 + 1, 10**18 + 2], dtype=np.int64)
    m = Matrix([()], ts, np.array([0.0, 1.0, 2.0]), np.array([[0]]), np.array([[3]]),
               np.array([10**18 + 2], dtype=np.int64), 2)  # fmt: skip
    got, ok = windows.extrapolated(m, True, False)
    assert bool(ok[0]) and got[0] == 2.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(-(10**6), 10**6), max_size=8), min_size=1, max_size=5),
    st.lists(st.integers(-(2 * 10**6), 2 * 10**6), max_size=6),
    st.sampled_from(["left", "right"]),
    st.booleans(),
)
def test_stacked_search_is_a_searchsorted_per_series(
    series: list[list[int]], qs: list[int], side: str, far: bool
) -> None:
    """One search over all series (each in its own band) finds what a search per series does;
    times too far apart for the bands take the loop."""
    from services.query_api.promql.values import stacked_search

    def times(xs: list[int]) -> np.ndarray:
        a = np.array(xs, dtype=np.int64)
        return (a % 5 - 2) * 2**61 if far else a  # far: +-2**62 apart, bands would overflow

    parts = [np.sort(times(p)) for p in series]
    q = times(qs)
    got = stacked_search(parts, q, side)  # type: ignore[arg-type]
    base = np.cumsum([0] + [p.shape[0] for p in parts])
    want = [np.searchsorted(p, q, side=side) + base[i] for i, p in enumerate(parts)]  # type: ignore[call-overload]
    assert got.shape == (len(parts), q.shape[0])
    for i in range(len(parts)):
        assert got[i].tolist() == want[i].tolist()
