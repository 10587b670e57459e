"""MPIT's chunked greedy picks exactly what the one-node-per-step lazy heap picked.

``_heap_greedy`` below is the greedy as it was before the chunks (one heap
step per node, in Python), kept here as the reference: every case compares
the two node sets, on dense and sparse D, with busy and absent nodes, at
every job size of small halls, at hot sizes of 400-node halls, with chunk
sizes shrunk so that the small halls go through every branch of the chunks
(hot rows, nodes pushed off the level, the heap after the level), and with a
job that draws less than idle (inlets fall: the heap alone, as before).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
import scipy.sparse as sp

from services.allocator.model import HallModel, IntArray
from services.allocator.policies import View
from services.allocator.policies import mpit_greedy as mg
from services.allocator.policies.mpit import _columns, greedy
from services.common.halls.synthetic import tiled_hall
from services.common.thermal import Float64Array, Hall, reference_hall
from tests.allocator.policy_halls import random_hall, view_of


def _heap_greedy(view: View, rise: Float64Array, n: int) -> IntArray:
    """The greedy before chunks (commit 5c7e4ac), its inputs computed as they were then."""
    free = view.free_idx
    cols = view.model.d_csc[:, free].tocsc()
    cols.sort_indices()
    heat = sp.csc_matrix(
        (cols.data * np.repeat(rise[free], np.diff(cols.indptr)), cols.indices, cols.indptr),
        shape=cols.shape,
    )
    colsum = np.asarray(view.model.d_csc[:, free].sum(axis=0)).ravel()
    q = np.floor(1000.0 * colsum * rise[free])
    tin = view.inlet_c
    today = np.full(len(free), float(tin.max()))
    nonempty = np.diff(heat.indptr) > 0
    if heat.nnz:
        tops = np.maximum.reduceat(tin[heat.indices] + heat.data, heat.indptr[:-1][nonempty])
        today[nonempty] = np.maximum(float(tin.max()), tops)
    chosen = _heap_positions(heat, tin.copy(), today, np.lexsort((free, q)), n)
    return np.sort(free[chosen])


def _heap_positions(
    heat: sp.csc_matrix, tin: Float64Array, today: Float64Array, by_rank: IntArray, n: int
) -> IntArray:
    """Its loop, verbatim: one heap step per node, keys ``(peak if joined, tie rank)``."""
    indptr, indices, data = heat.indptr, heat.indices, heat.data
    peak = float(tin.max())
    start = np.round(today, 9)
    rank = np.empty(len(by_rank), dtype=np.int64)
    rank[by_rank] = np.arange(len(by_rank))
    heap = list(zip(start.tolist(), rank.tolist(), strict=True))
    heapq.heapify(heap)
    bounds = indptr.tolist()
    position = by_rank.tolist()
    chosen: list[int] = []
    while len(chosen) < n:
        key, r = heapq.heappop(heap)
        j = position[r]
        a, b = bounds[j], bounds[j + 1]
        if b > a:
            rows, add = indices[a:b], data[a:b]
            fresh = round(max(peak, float((tin[rows] + add).max())), 9)
        else:
            fresh = round(peak, 9)
        if fresh > key:
            heapq.heappush(heap, (fresh, r))
            continue
        if b > a:
            tin[rows] += add
        peak = max(peak, fresh)
        chosen.append(j)
    return np.array(chosen, dtype=np.int64)


def _same(view: View, power_w: float, sizes: list[int]) -> None:
    rise = view.rise_per_node(power_w)
    for n in sizes:
        assert np.array_equal(greedy(view, rise, n), _heap_greedy(view, rise, n)), f"n = {n}"


def _busy(model: HallModel, seed: int, share: float) -> np.ndarray:
    return model.present & (np.random.default_rng(seed).random(model.n) < share)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few nodes, so that halls of tens of nodes take every branch."""
    monkeypatch.setattr(mg, "LEVEL_MIN", 2)
    monkeypatch.setattr(mg, "CHUNK_START", 4)
    monkeypatch.setattr(mg, "CHUNK_MIN", 2)


def _small_halls() -> list[Hall]:
    ref = reference_hall()
    dense = tiled_hall(2, 10, seed=4)
    return [
        ref,
        ref.subset_rows([0]),  # row 1 absent
        ref.replace(d_matrix=sp.csr_matrix(ref.d_matrix)),
        dense,
        dense.replace(d_matrix=sp.csr_matrix(dense.d_matrix)),
        random_hall(1, 2, 3, 4),
    ]


@pytest.mark.usefixtures("small_chunks")
def test_the_chunked_greedy_picks_what_the_heap_picked_at_every_size() -> None:
    for k, hall in enumerate(_small_halls()):
        model = HallModel(hall)
        for seed, share in ((k, 0.0), (10 + k, 0.3), (20 + k, 0.6)):
            view = view_of(model, _busy(model, seed, share))
            free = len(view.free_idx)
            _same(view, 3500.0, list(range(1, free + 1)))
            _same(view, 2900.0, sorted({1, free // 2, free}))


@pytest.mark.usefixtures("small_chunks")
def test_a_job_below_idle_power_takes_the_heap_as_before() -> None:
    model = HallModel(tiled_hall(2, 10, seed=6))
    view = view_of(model, _busy(model, 6, 0.3))
    assert (view.rise_per_node(600.0)[view.free_idx] < 0).all()
    _same(view, 600.0, list(range(1, len(view.free_idx) + 1, 3)))


@pytest.mark.parametrize("sparse", [False, True])
def test_the_chunked_greedy_picks_what_the_heap_picked_on_400_node_halls(sparse: bool) -> None:
    model = HallModel(tiled_hall(4, 25, seed=2, sparse=sparse))
    rng = np.random.default_rng(7)
    for case in range(6):
        view = view_of(model, _busy(model, 30 + case, rng.uniform(0.0, 0.5)))
        free = len(view.free_idx)
        # hot sizes (the level, hot rows, nodes pushed off it) and nearly all (the heap after it)
        sizes = [int(free * x) for x in (0.3, 0.45, 0.6)] + [free - 3, free]
        _same(view, 3500.0, sizes)


@pytest.mark.usefixtures("small_chunks")
def test_the_chunks_decide_as_the_heap_at_the_rounding_boundary() -> None:
    """Inlets and heat in steps of 0.3 nK around one peak: many candidate peaks land within
    an ulp of a rounding boundary of 1 nK, where a sloppy bound or rounding would differ."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        rows, cols = int(rng.integers(6, 30)), int(rng.integers(4, 40))
        tin = 25.0 + 0.3e-9 * rng.integers(-12, 8, rows)
        tin[rng.random(rows) < 0.2] = -np.inf  # absent nodes
        dense = 0.3e-9 * rng.integers(0, 6, (rows, cols)) * (rng.random((rows, cols)) < 0.25)
        dense[:, rng.random(cols) < 0.3] *= 1e3  # some nodes that clearly raise the peak
        heat = sp.csc_matrix(dense)
        today = np.full(cols, float(tin.max()))
        for j in range(cols):
            a, b = heat.indptr[j], heat.indptr[j + 1]
            if b > a:
                today[j] = max(today[j], float((tin[heat.indices[a:b]] + heat.data[a:b]).max()))
        by_rank = rng.permutation(cols)
        for n in sorted({1, cols // 3, cols // 2, cols}):
            want = _heap_positions(heat, tin.copy(), today, by_rank, n)
            monotone = bool(heat.data.min() >= 0) if heat.nnz else True
            got = mg.greedy_positions(
                heat, np.arange(cols), tin.copy(), today, by_rank, n, monotone
            )
            assert sorted(got) == sorted(want.tolist())


def test_round9_rounds_as_python_does() -> None:
    rng = np.random.default_rng(9)
    values = [
        rng.uniform(-50, 60, 20_000),
        # within an ulp of a half in the 10th decimal: where numpy's scaled rint can differ
        (np.floor(rng.uniform(0, 6e10, 5_000)) + 0.5) / 1e9,
        np.nextafter((np.arange(1, 2_000) + 0.5) / 1e9 + 20.0, np.inf),
        np.array([1 / 1024, 3 / 1024, -1 / 1024, 0.0, -0.0, 1e7 + 0.1, np.inf, -np.inf]),
    ]
    for x in values:
        got = mg.round9(x)
        want = np.array([round(v, 9) for v in x.tolist()])
        assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    assert math.isnan(float(mg.round9(np.array([np.nan]))[0]))


def test_a_decisions_columns_refuse_to_serve_once_another_decision_took_the_arrays() -> None:
    """The per-entry arrays are the model's, lent to one decision at a time: a stale
    decision's columns fail loudly rather than read another decision's numbers."""
    model = HallModel(tiled_hall(2, 10, seed=7))
    first = view_of(model, _busy(model, 7, 0.3))
    rise = first.rise_per_node(3500.0)
    cols = _columns(first, rise)
    before = cols.heat.toarray()
    second = view_of(model, _busy(model, 8, 0.5))
    greedy(second, second.rise_per_node(2900.0), 5)
    with pytest.raises(RuntimeError, match="reused by another"):
        _ = cols.heat
    again = _columns(view_of(model, _busy(model, 7, 0.3)), rise)
    assert np.array_equal(again.heat.toarray(), before)
