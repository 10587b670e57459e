"""The columnar Batch: construction, concatenation; sort_dedup with last-write-wins."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.readings import Batch, Series, sort_dedup


def test_from_series_and_iteration_round_trip() -> None:
    a = Series("/a", np.array([1, 2], np.int64), np.array([1.0, 2.0]))
    b = Series("/b", np.array([5], np.int64), np.array([9.0]))
    batch = Batch.from_series([a, b])
    assert len(batch) == 3 and batch.series_count == 2
    assert batch.offsets.tolist() == [0, 2, 3]
    got = list(batch)
    assert [s.sensor for s in got] == ["/a", "/b"]
    assert got[0].values.tolist() == [1.0, 2.0] and got[1].timestamps_ns.tolist() == [5]
    assert batch.sensor_per_reading().tolist() == [0, 0, 1]


def test_concat_keeps_offsets_consistent() -> None:
    b1 = Batch.single("/a", [1, 2], [1, 2])
    b2 = Batch.from_rows(["/b", "/c"], [3, 4], [3, 4])
    merged = Batch.concat([b1, Batch.empty(), b2])
    assert merged.sensors == ["/a", "/b", "/c"]
    assert merged.offsets.tolist() == [0, 2, 3, 4]
    assert merged.series(2).values.tolist() == [4.0]


def test_invalid_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="offsets"):
        Batch(["/a"], np.array([0], np.int64), np.array([], np.int64), np.array([]))
    with pytest.raises(ValueError, match="differ"):
        Batch(["/a"], np.array([0, 1], np.int64), np.array([1], np.int64), np.array([1.0, 2.0]))


def test_sort_dedup_keeps_last_of_equal_timestamps() -> None:
    ts, vs = sort_dedup(np.array([5, 1, 5, 2], np.int64), np.array([1.0, 2.0, 3.0, 4.0]))
    assert ts.tolist() == [1, 2, 5] and vs.tolist() == [2.0, 4.0, 3.0]
