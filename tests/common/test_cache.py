"""The sensor cache: rings per sensor, blocks per group, latest values and averages."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.cache import SensorCache
from services.common.readings import Batch

S = 1_000_000_000


def ts(*seconds: float) -> np.ndarray:
    return (np.array(seconds, dtype=np.float64) * S).astype(np.int64)


def test_ring_keeps_the_newest_points_in_order_across_growth_and_wrap() -> None:
    cache = SensorCache(window_s=1000, max_points=50)
    for start in range(0, 120, 7):  # uneven chunks force growth, then wrap-around
        k = np.arange(start, start + 7)
        cache.put("/a", ts(*k), k.astype(np.float64))
    t, v = cache.readings("/a")
    assert v.tolist() == list(range(126 - 50, 126))
    assert np.all(np.diff(t) > 0)
    assert cache.latest("/a").value == 125.0


def test_put_batch_and_forget() -> None:
    cache = SensorCache()
    batch = Batch.from_rows(["/x", "/y", "/x"], ts(1, 1, 2), [1.0, 5.0, 2.0])
    cache.put_batch(batch)
    assert cache.sensors() == ["/x", "/y"]
    assert cache.latest("/x").value == 2.0
    cache.forget("/x")
    assert "/x" not in cache and cache.latest("/x") is None


def test_readings_respect_window_and_since() -> None:
    cache = SensorCache(window_s=10)
    cache.put("/a", ts(*range(30)), np.arange(30, dtype=np.float64))
    t, _ = cache.readings("/a")
    assert t[0] == 19 * S and t[-1] == 29 * S
    t, _ = cache.readings("/a", since_ns=25 * S)
    assert t.tolist() == [25 * S, 26 * S, 27 * S, 28 * S, 29 * S]


def test_time_weighted_average_holds_each_value_until_the_next() -> None:
    cache = SensorCache()
    # 0 for 9 s, then 10 for 1 s: the plain mean (5) would be wrong.
    cache.put("/a", ts(0, 9, 10), np.array([0.0, 10.0, 10.0]))
    assert cache.average("/a", 10) == pytest.approx(1.0)
    # A window starting mid-reading counts that reading from the window start.
    assert cache.average("/a", 2) == pytest.approx(5.0)
    assert cache.average("/missing", 10) is None


def test_block_shares_timestamps_and_skips_missing_values() -> None:
    cache = SensorCache(window_s=100, max_points=4)
    h = cache.add_block(["/g/a", "/g/b"], points=100)
    for i in range(6):
        b = np.nan if i % 2 else 10.0 * i
        cache.put_rows(h, ts(i), np.array([float(i), b]))
    t, v = cache.readings("/g/a")
    assert v.tolist() == [2.0, 3.0, 4.0, 5.0], "capped at max_points, oldest first"
    t, v = cache.readings("/g/b")
    assert v.tolist() == [20.0, 40.0] and t.tolist() == [2 * S, 4 * S]
    assert cache.latest("/g/b").value == 40.0 and cache.latest("/g/b").timestamp_ns == 4 * S
    assert cache.average("/g/a", 2) == pytest.approx(3.5)
    assert cache.sensors() == ["/g/a", "/g/b"] and len(cache) == 2


def test_block_names_are_exclusive_and_drop_releases_them() -> None:
    cache = SensorCache()
    cache.put("/solo", ts(1), np.array([1.0]))
    with pytest.raises(ValueError, match="already cached"):
        cache.add_block(["/solo", "/other"], 10)
    h = cache.add_block(["/other"], 10)
    with pytest.raises(ValueError, match="block"):
        cache.put("/other", ts(1), np.array([1.0]))
    cache.drop_block(h)
    assert "/other" not in cache
    cache.add_block(["/other"], 10)


def test_points_for_covers_the_window_within_the_cap() -> None:
    cache = SensorCache(window_s=900, max_points=1024)
    assert cache.points_for(1.0) == 901
    assert cache.points_for(0.1) == 1024


def test_put_batch_equals_putting_reading_by_reading() -> None:
    """A batch that repeats sensors, overfills rings and grows them (16 -> 32 -> 50 points)
    leaves the same rings as one put per reading, in arrival order."""
    rng = np.random.default_rng(3)
    batched, one_by_one = SensorCache(max_points=50), SensorCache(max_points=50)
    t = 0
    for size in (5, 40, 7, 130, 1, 60):
        names = [f"/r/s{i}" for i in rng.integers(0, 6, size)]
        stamps = ts(*range(t, t + size))
        t += size
        values = rng.normal(size=size)
        batched.put_batch(Batch.from_rows(names, stamps, values))
        for name, s, v in zip(names, stamps, values, strict=True):
            one_by_one.put(name, np.array([s]), np.array([v]))
    assert batched.sensors() == one_by_one.sensors()
    for name in one_by_one.sensors():
        a, b = batched.readings(name), one_by_one.readings(name)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), name
        assert batched.latest(name) == one_by_one.latest(name)


def test_a_forgotten_sensor_frees_its_ring_for_the_next() -> None:
    cache = SensorCache(max_points=20)
    cache.put_batch(Batch.from_rows(["/a", "/b"], ts(1, 1), [1.0, 2.0]))
    cache.forget("/a")
    cache.put_batch(Batch.from_rows(["/c", "/b"], ts(2, 2), [3.0, 4.0]))
    assert cache.sensors() == ["/b", "/c"] and len(cache) == 2
    assert cache.readings("/c")[1].tolist() == [3.0]
    assert cache.readings("/b")[1].tolist() == [2.0, 4.0]
