"""Grid alignment and gap-aware interpolation, against numpy on random series."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.query_api.virtual.align import (
    first_grid_point,
    grid,
    interpolate,
    typical_interval_ns,
)


def test_grid_is_multiples_of_the_interval_since_the_epoch() -> None:
    assert grid(1_500, 5_000, 1_000).tolist() == [2_000, 3_000, 4_000]
    assert grid(-2_500, 0, 1_000).tolist() == [-2_000, -1_000]
    assert first_grid_point(3_000, 1_000) == 3_000
    assert grid(10, 11, 1_000).size == 0


def test_gaps_larger_than_the_limit_stay_gaps() -> None:
    ts = np.array([0, 10, 20, 60, 70], dtype=np.int64)
    vs = np.array([0.0, 1.0, 2.0, 6.0, 7.0])
    at = np.arange(0, 80, 5, dtype=np.int64)
    out = interpolate(ts, vs, at, max_gap_ns=15)
    expected = [0, 0.5, 1, 1.5, 2, None, None, None, None, None, None, None, 6, 6.5, 7, None]
    assert [None if np.isnan(v) else v for v in out] == expected


def test_exact_hits_survive_wide_gaps_and_nan_readings_are_gaps() -> None:
    ts = np.array([0, 100, 110], dtype=np.int64)
    vs = np.array([1.0, 2.0, np.nan])
    out = interpolate(ts, vs, np.array([0, 50, 100, 105], dtype=np.int64), max_gap_ns=10)
    assert out[0] == 1.0 and np.isnan(out[1]) and out[2] == 2.0 and np.isnan(out[3])


def test_typical_interval() -> None:
    assert typical_interval_ns(np.array([0, 10, 20, 35, 40], dtype=np.int64)) == 10
    assert typical_interval_ns(np.array([5], dtype=np.int64)) is None


random_series = st.integers(min_value=1, max_value=50).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(1, 1_000_000), min_size=n, max_size=n),
        st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=n, max_size=n),
        st.lists(st.integers(-100_000, 60_000_000), min_size=1, max_size=80),
    )
)


@settings(max_examples=200, deadline=None)
@given(random_series)
def test_interpolation_agrees_with_numpy(data: tuple[list[int], list[float], list[int]]) -> None:
    steps, values, at = data
    ts = np.cumsum(np.asarray(steps, dtype=np.int64))
    vs = np.asarray(values)
    points = np.asarray(sorted(at), dtype=np.int64)
    out = interpolate(ts, vs, points, max_gap_ns=2**62)
    inside = (points >= ts[0]) & (points <= ts[-1])
    expected = np.interp(points[inside], ts, vs)
    assert out[inside] == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert bool(np.isnan(out[~inside]).all())  # never extrapolated
