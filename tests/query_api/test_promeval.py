"""Range functions of the PromQL subset against window-by-window sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.query_api.promeval import over_time

S = 10**9


def naive(name: str, ts: np.ndarray, vs: np.ndarray, steps: np.ndarray, rng: int) -> list[float]:
    out = []
    for t in steps.tolist():
        window = vs[(ts >= t - rng) & (ts <= t)]
        if window.shape[0] == 0:
            out.append(math.nan)
        else:
            with np.errstate(invalid="ignore"):  # +inf and -inf: NaN, as Prometheus adds
                total = math.fsum(window) if np.isfinite(window).all() else float(np.sum(window))
            out.append(total if name == "sum_over_time" else total / window.shape[0])
    return out


def test_an_infinity_counts_only_in_the_windows_that_hold_it() -> None:
    ts = np.arange(8, dtype=np.int64) * S
    vs = np.array([1.0, 2.0, np.inf, 3.0, 4.0, -np.inf, 5.0, 6.0])
    steps = np.arange(8, dtype=np.int64) * S
    sums = over_time("sum_over_time", ts, vs, steps, 1 * S)  # windows [t - 1 s, t]
    assert sums.tolist() == [1.0, 3.0, math.inf, math.inf, 7.0, -math.inf, -math.inf, 11.0]
    avgs = over_time("avg_over_time", ts, vs, steps, 1 * S)
    assert avgs.tolist() == [1.0, 1.5, math.inf, math.inf, 3.5, -math.inf, -math.inf, 5.5]
    both = over_time("sum_over_time", ts, vs, steps, 3 * S)  # +inf and -inf in one window
    assert math.isnan(both[5]) and both[7] == -math.inf


values = st.one_of(st.floats(-1e6, 1e6), st.sampled_from([math.inf, -math.inf]))


@settings(max_examples=100, deadline=None)
@given(st.lists(values, min_size=1, max_size=40), st.integers(0, 5))
def test_window_sums_agree_with_summing_each_window(vals: list[float], rng_s: int) -> None:
    vs = np.asarray(vals)
    ts = np.arange(vs.shape[0], dtype=np.int64) * S
    steps = np.arange(-1, vs.shape[0] + 1, dtype=np.int64) * S
    for name in ("sum_over_time", "avg_over_time"):
        got = over_time(name, ts, vs, steps, rng_s * S)
        want = naive(name, ts, vs, steps, rng_s * S)
        assert got.tolist() == pytest.approx(want, rel=1e-9, abs=1e-6, nan_ok=True), name
