"""Chunk codec and merge rules of the embedded backend."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.storage import chunks
from services.common.storage.chunks import Piece


@pytest.mark.parametrize("enc", [chunks.RAW, chunks.ZLIB])
def test_encode_decode_is_bit_exact(enc: int) -> None:
    rng = np.random.default_rng(3)
    ts = np.cumsum(rng.integers(1, 10**9, 5000)).astype(np.int64) - 10**12
    vs = rng.normal(size=5000)
    vs[[0, 7, 9]] = [np.nan, np.inf, -np.inf]
    tb, vb = chunks.encode(ts, vs, enc)
    t2, v2 = chunks.decode(tb, vb, enc)
    assert t2.tolist() == ts.tolist()
    assert v2.view(np.int64).tolist() == vs.view(np.int64).tolist()  # NaN payloads too
    e = np.empty(0, np.int64)
    assert chunks.decode(*chunks.encode(e, e.astype(np.float64), enc), enc)[0].shape == (0,)


def test_zlib_shrinks_regular_series() -> None:
    ts = np.arange(8192, dtype=np.int64) * 10**9
    vs = np.round(np.sin(np.arange(8192) / 50) * 100, 2)
    tb, vb = chunks.encode(ts, vs, chunks.ZLIB)
    assert len(tb) + len(vb) < 8192 * 16 / 2


def test_merge_disjoint_pieces_concatenates_in_time_order() -> None:
    a = Piece(5, np.array([10, 11]), np.array([1.0, 2.0]), True)
    b = Piece(1, np.array([1, 2]), np.array([3.0, 4.0]), True)
    ts, vs = chunks.merge([a, b])
    assert ts.tolist() == [1, 2, 10, 11] and vs.tolist() == [3.0, 4.0, 1.0, 2.0]


def test_merge_overlap_newest_write_wins() -> None:
    old = Piece(1, np.array([1, 2, 3]), np.array([1.0, 1.0, 1.0]), True)
    new = Piece(2, np.array([3, 2]), np.array([2.0, 2.0]), False)  # unsorted staged write
    for order in ([old, new], [new, old]):
        ts, vs = chunks.merge(order)
        assert ts.tolist() == [1, 2, 3] and vs.tolist() == [1.0, 2.0, 2.0]


def test_group_by_key_sorts_and_deduplicates_per_key() -> None:
    keys = np.array([2, 1, 2, 1, 2], dtype=np.int64)
    ts = np.array([5, 3, 4, 3, 5], dtype=np.int64)
    vs = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    uk, off, t, v = chunks.group_by_key(keys, ts, vs)
    assert uk.tolist() == [1, 2] and off.tolist() == [0, 1, 3]
    assert t.tolist() == [3, 4, 5] and v.tolist() == [4.0, 3.0, 5.0]  # last write wins
