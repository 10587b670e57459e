"""Encoding of stored virtual results: grid timestamps when evenly spaced, raw otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.storage import chunks
from services.common.storage import virtual_chunks as vc

MIN, MAX = -(2**63), 2**63 - 1


@pytest.mark.parametrize(
    ("ts", "enc"),
    [
        ([5], vc.GRID),
        ([5, 9], vc.GRID),
        ([0, 10, 20, 30], vc.GRID),
        ([MIN, MAX], chunks.RAW),  # the step does not fit in int64
        ([MIN, 0], chunks.RAW),  # a step of 2**63 does not fit either
        ([MIN, -1, MAX - 1], vc.GRID),  # the largest step that fits; decoding wraps back
        ([0, 10, 21], chunks.RAW),
    ],
)
def test_round_trip(ts: list[int], enc: int) -> None:
    t = np.array(ts, dtype=np.int64)
    v = np.arange(t.shape[0]) / 3
    v[0] = np.nan
    got_enc, tb, vb = vc.encode(t, v)
    assert got_enc == enc
    if enc == vc.GRID:
        assert len(tb) == 16  # whatever the length
    dts, dvs = vc.decode(got_enc, t.shape[0], tb, vb)
    assert dts.tolist() == ts and dvs.tobytes() == v.tobytes()


def test_outside_cuts_a_chunk_in_two() -> None:
    t = np.arange(0, 100, 10, dtype=np.int64)
    parts = vc.outside(vc.Chunk(0, 90, t, t * 1.0), 25, 61)
    assert [(p.t0, p.t1, p.ts.tolist()) for p in parts] == [
        (0, 20, [0, 10, 20]),
        (70, 90, [70, 80, 90]),
    ]
    assert vc.outside(vc.Chunk(0, 90, t, t * 1.0), -5, 500) == []
