"""Large halls: a sparse D gives the same decisions as the dense one, without N x N memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from services.allocator.engine import Allocator
from services.allocator.model import HallModel
from services.allocator.policies import REGISTRY, PolicyOptions
from services.allocator.policies.mc1x1 import shell_scores
from services.allocator.state import HallState
from services.common.halls.hallfile import load_hall, save_hall
from services.common.halls.synthetic import tiled_hall
from services.common.thermal import HallError, reference_hall


def _states(model: HallModel, count: int, seed: int) -> list[tuple[HallState, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        state = HallState(model)
        busy = np.flatnonzero(rng.random(model.n) < rng.uniform(0.0, 0.6))
        if busy.size:
            state.place("bg", busy, model.hall.busy_power_w)
        hot = k % 2 == 1  # every other case a big job that moves the hot spot
        size = int(state.free_count * rng.uniform(0.3, 0.6)) if hot else int(rng.integers(2, 30))
        out.append((state, max(1, min(size, state.free_count))))
    return out


_DENSE = tiled_hall(2, 10, seed=2)
_PAIR = (HallModel(_DENSE), HallModel(_DENSE.replace(d_matrix=sp.csr_matrix(_DENSE.d_matrix))))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_sparse_d_decides_exactly_as_the_dense_one(name: str) -> None:
    a, b = _PAIR
    for (sa, n), (sb, _) in zip(_states(a, 4, 1), _states(b, 4, 1), strict=True):
        # a time limit no run reaches: both solve exactly (a loaded machine must not decide)
        opts = PolicyOptions(seed=3, mpit_time_limit_s=60.0)
        da = Allocator(name, opts).decide(sa, n, 0.2)
        db = Allocator(name, opts).decide(sb, n, 0.2)
        assert da.choice is not None and db.choice is not None
        assert da.choice.nodes == db.choice.nodes
        assert [o.nodes for o in da.runner_ups] == [o.nodes for o in db.runner_ups]
        assert db.choice.max_tin_c == pytest.approx(da.choice.max_tin_c, abs=1e-9)


def test_shell_scores_are_the_sums_of_the_nearest_shells() -> None:
    for hall in (reference_hall(), reference_hall().subset_rows([1]), tiled_hall(4, 25, seed=1)):
        model = HallModel(hall)
        rng = np.random.default_rng(4)
        for _ in range(10):
            free = np.flatnonzero((rng.random(model.n) < rng.uniform(0.2, 1.0)) & model.present)
            n = int(rng.integers(1, len(free) + 1))
            dense = np.partition(model.shell_dist(free, free), n - 1, axis=1)[:, :n].sum(axis=1)
            assert np.array_equal(shell_scores(model, free, n), dense)


def test_a_2000_node_decision_never_builds_an_n_by_n_matrix() -> None:
    """A dense D, shell matrix or heat block would take 16-32 MB here; decisions need ~5 MB."""
    model = HallModel(tiled_hall(10, 50, seed=1, sparse=True))
    _ = model.cc_min, model.d_csc, model.d_csr
    cases = _states(model, 2, 7)
    for name in sorted(REGISTRY):
        allocator = Allocator(name, PolicyOptions(seed=1))
        tracemalloc.start()
        try:
            for state, n in cases:
                assert allocator.decide(state, n, 0.2).placed
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 10e6, f"{name}: {peak / 1e6:.0f} MB"


def test_a_sparse_hall_file_round_trips(tmp_path: Path) -> None:
    hall = tiled_hall(2, 10, seed=5, sparse=True)
    path = save_hall(hall, tmp_path / "big.yaml")
    assert (tmp_path / "big.D.npz").exists()
    back = load_hall(path)
    assert back.sparse and (back.d_matrix != hall.d_matrix).nnz == 0
    p = hall.powers_w(np.ones(hall.n_nodes))
    assert np.allclose(back.inlet_c(p), tiled_hall(2, 10, seed=5, sparse=True).inlet_c(p))


def test_a_sparse_d_is_validated_like_a_dense_one() -> None:
    hall = reference_hall()
    bad = sp.csr_matrix(hall.d_matrix)
    bad[3, 4] = -1.0
    with pytest.raises(HallError, match=r"D\[3, 4\] = -1.0"):
        hall.replace(d_matrix=bad)
    with pytest.raises(HallError, match="D must be 40x40"):
        hall.replace(d_matrix=sp.csr_matrix((39, 39)))


def test_the_sparse_synthetic_hall_has_the_dense_ones_structure() -> None:
    dense, sparse = tiled_hall(4, 15, seed=1), tiled_hall(4, 15, seed=1, sparse=True)
    assert np.array_equal(dense.d_matrix > 0, sparse.d_matrix.toarray() > 0)
    ratio = sparse.d_matrix.toarray()[dense.d_matrix > 0] / dense.d_matrix[dense.d_matrix > 0]
    assert 0.5 < float(np.median(ratio)) < 2.0  # same scale, different jitter draws


@pytest.mark.parametrize("sparse", [False, True])
def test_the_models_column_sums_and_inlet_rises_are_bit_for_bit_the_columns_own(
    sparse: bool,
) -> None:
    """Decisions compare these sums (tie ranks, peaks binned to 0.1 mK): the shortcuts that
    skip copying columns must give exactly what summing the copied columns gives."""
    model = HallModel(tiled_hall(4, 25, seed=8, sparse=sparse).subset_rows([0, 1, 3]))
    rng = np.random.default_rng(8)
    rise = rng.uniform(-500.0, 2500.0, model.n)
    for share in (0.02, 0.3, 0.6, 1.0):
        nodes = np.flatnonzero(rng.random(model.n) < share)
        d = model.d_csc[:, nodes]
        assert np.array_equal(model.col_sums[nodes], np.asarray(d.sum(axis=0)).ravel())
        assert np.array_equal(model.inlet_rise(nodes, rise), d @ rise[nodes])
    unsorted = rng.permutation(model.n)[: model.n // 2]
    assert np.array_equal(
        model.inlet_rise(unsorted, rise), model.d_csc[:, unsorted] @ rise[unsorted]
    )
