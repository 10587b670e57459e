"""The memory tier of virtual-sensor results: coverage, trimming, budget."""

from __future__ import annotations

import numpy as np

from services.query_api.virtual.cache import MemoryTier, Segment, slice_segments


def seg(a: int, b: int, version: int = 1) -> Segment:
    ts = np.arange(a, b, dtype=np.int64)
    return Segment(a, b, computed_at=7, version=version, timestamps_ns=ts, values=ts * 1.0)


def test_coverage_needs_every_part_and_the_same_version() -> None:
    m = MemoryTier(1000)
    m.put("/v", seg(0, 10))
    m.put("/v", seg(10, 20))
    got = m.covering("/v", 1, 5, 15)
    assert got is not None and [s.start for s in got] == [0, 10]
    assert slice_segments(got, 5, 15)[0].tolist() == list(range(5, 15))
    assert m.covering("/v", 1, 5, 25) is None
    assert m.covering("/v", 2, 5, 15) is None  # results of an older definition
    assert m.covering("/w", 1, 0, 1) is None


def test_drop_trims_straddling_segments() -> None:
    m = MemoryTier(1000)
    m.put("/v", seg(0, 20))
    m.drop("/v", 5, 8)
    assert m.covering("/v", 1, 0, 5) is not None and m.covering("/v", 1, 8, 20) is not None
    assert m.covering("/v", 1, 4, 9) is None
    left = m.covering("/v", 1, 0, 5)
    assert left is not None and left[0].timestamps_ns.tolist() == [0, 1, 2, 3, 4]


def test_budget_drops_the_least_recently_used() -> None:
    m = MemoryTier(25)
    m.put("/a", seg(0, 10))
    m.put("/b", seg(0, 10))
    assert m.covering("/a", 1, 0, 10) is not None  # /a is now the most recent
    m.put("/c", seg(0, 10))
    assert m.covering("/b", 1, 0, 10) is None
    assert m.covering("/a", 1, 0, 10) is not None and m.covering("/c", 1, 0, 10) is not None
    m.put("/huge", seg(0, 100))  # larger than the whole budget: not kept
    assert m.covering("/huge", 1, 0, 100) is None


def test_slices_are_read_only_views_of_one_segment_or_a_copy_of_several() -> None:
    m = MemoryTier(1000)
    m.put("/v", seg(0, 10))
    one = m.covering("/v", 1, 2, 7)
    assert one is not None
    ts, vs = slice_segments(one, 2, 7)
    assert ts.tolist() == [2, 3, 4, 5, 6] and vs.tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert np.shares_memory(ts, one[0].timestamps_ns)  # no copy
    m.put("/v", seg(10, 20))
    two = m.covering("/v", 1, 8, 12)
    assert two is not None
    ts, vs = slice_segments(two, 8, 12)
    assert ts.tolist() == [8, 9, 10, 11] and vs.tolist() == [8.0, 9.0, 10.0, 11.0]
    assert not ts.flags.writeable and not vs.flags.writeable  # answers cannot corrupt the tier
