"""MPIT against brute force, choice for choice (tie rule included), at every size up to hot ones.

Brute force enumerates every n-subset of the free nodes (vectorised), takes
the lowest peak, then among the sets within the tie tolerance the least
``Σ q_j M + j`` and, last, the lexicographically smallest set (the first in
``itertools.combinations`` order). Where brute force is out of reach (jobs
of 30-60 % of the 40-node hall) the layered search is checked against the
independent two-stage MILP on the unreduced problem.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from services.allocator.model import HallModel
from services.allocator.policies import Request, View, create
from services.allocator.policies.mpit import (
    PEAK_TOLERANCE_C,
    greedy,
    heat_problem,
    peak_after,
    solve_exact,
    tie_costs,
)
from services.allocator.policies.mpit_milp import solve_milp
from services.allocator.policies.mpit_search import Reduced, reduce
from services.common.thermal import Hall, reference_hall
from tests.allocator.policy_halls import random_hall, view_of


def _brute_mpit(view: View, n: int, power_w: float) -> tuple[float, tuple[int, ...]]:
    """Lowest peak over all n-subsets of the free nodes, then the documented tie rule."""
    rise = view.rise_per_node(power_w)
    free = view.free_idx
    rows = np.flatnonzero(view.model.present)
    heat = view.model.d_csc.toarray()[np.ix_(rows, free)] * rise[free]
    combos = np.array(list(itertools.combinations(range(len(free)), n)), dtype=np.int64)
    onehot = np.zeros((len(combos), len(free)))
    np.put_along_axis(onehot, combos, 1.0, axis=1)
    peaks = (view.inlet_c[rows][None, :] + onehot @ heat.T).max(axis=1)
    best = float(peaks.min())
    cost = onehot @ tie_costs(view, rise, n)
    tied = peaks <= best + PEAK_TOLERANCE_C
    winner = int(np.flatnonzero(tied & (cost == cost[tied].min()))[0])  # first = lexicographic
    return best, tuple(free[combos[winner]].tolist())


def _assert_exact(view: View, n: int, power_w: float, chosen: np.ndarray) -> None:
    best, winner = _brute_mpit(view, n, power_w)
    got = peak_after(view, view.rise_per_node(power_w), chosen)
    assert best - 1e-9 <= got <= best + PEAK_TOLERANCE_C
    assert tuple(chosen.tolist()) == winner
    assert view.free[chosen].all()


@pytest.mark.parametrize("seed", range(6))
def test_mpit_is_exact_at_every_size_on_dense_random_halls(seed: int) -> None:
    model = HallModel(random_hall(seed))
    busy = np.random.default_rng(100 + seed).random(model.n) < 0.3
    view = view_of(model, busy)
    mpit = create("mpit")
    for n in range(1, len(view.free_idx) + 1):
        _assert_exact(view, n, 3500.0, mpit.choose(view, Request(n, 3500.0), 0)[0])


@pytest.mark.parametrize("seed", range(4))
def test_mpit_is_exact_at_hot_sizes_on_the_reference_row(seed: int) -> None:
    """Row 0 of the reference hall (20 nodes, row 1 absent), jobs of 30-60 % of the free nodes."""
    model = HallModel(reference_hall().subset_rows([0]))
    rng = np.random.default_rng(200 + seed)
    busy = model.present & (rng.random(model.n) < 0.25 * seed / 3)
    view = view_of(model, busy)
    free = len(view.free_idx)
    for n in sorted({round(free * 0.3), round(free * 0.45), round(free * 0.6)}):
        _assert_exact(view, n, 3300.0, create("mpit").choose(view, Request(n, 3300.0), 0)[0])


@pytest.mark.parametrize("seed", range(3))
def test_mpit_is_exact_at_hot_sizes_on_larger_dense_halls(seed: int) -> None:
    model = HallModel(random_hall(10 + seed, 2, 2, 4))
    view = view_of(model, np.zeros(model.n, bool))
    for n in (5, 7, 8, 10):
        _assert_exact(view, n, 3500.0, create("mpit").choose(view, Request(n, 3500.0), 0)[0])


def test_mpit_breaks_ties_on_every_key_by_the_lexicographically_smallest_set() -> None:
    """Four free nodes; {1,4} and {2,3} tie on peak, total rise (2500 mK) and index sum.

    Values are dyadic (2048 W, D in 2^-k K/W) so that the keys tie exactly.
    Nodes 1+2 overheat inlet 0, nodes 1+3 inlet 5; 2+4 and 3+4 the cold inlets.
    """
    p = 2048.0
    d = np.zeros((6, 6))
    d[0, 1] = d[5, 1] = 0.5 / p
    d[0, 2] = d[5, 3] = 0.5 / p
    d[1:5, 2] = d[1:5, 3] = 0.1875 / p
    d[1:5, 4] = 0.375 / p
    model = HallModel(Hall(1, 2, 3, d, idle_power_w=0.0, busy_power_w=p, name="ties"))
    busy = np.array([True, False, False, False, False, True])
    view = view_of(model, busy)
    chosen = create("mpit").choose(view, Request(2, p), 0)[0]
    assert chosen.tolist() == [1, 4]
    _assert_exact(view, 2, p, chosen)


@pytest.mark.parametrize("seed", range(3))
def test_mpit_milp_fallback_is_exact_too(seed: int) -> None:
    """With no state budget the layered search gives up at once and the MILP answers."""
    model = HallModel(random_hall(20 + seed, 2, 2, 4))
    busy = np.random.default_rng(seed).random(model.n) < 0.2
    view = view_of(model, busy)
    rise = view.rise_per_node(3500.0)
    for n in (3, 6, 8):
        nodes, proven = solve_exact(view, rise, n, 10.0, max_states=0)
        best, winner = _brute_mpit(view, n, 3500.0)
        assert proven and peak_after(view, rise, nodes) <= best + PEAK_TOLERANCE_C
        assert tuple(nodes.tolist()) == winner


def test_mpit_is_exact_when_the_job_draws_less_than_idle() -> None:
    """Negative power rise: inlets can fall, the bounds do not hold, the MILP answers alone."""
    model = HallModel(random_hall(30, 2, 2, 3))
    busy = np.zeros(model.n, bool)
    busy[[0, 7]] = True
    view = view_of(model, busy, idle_w=3000.0)
    for n in (2, 5):
        _assert_exact(view, n, 2700.0, create("mpit").choose(view, Request(n, 2700.0), 0)[0])


@pytest.mark.parametrize("n", [4, 7, 10])
def test_reduce_keeps_every_set_that_can_tie(n: int) -> None:
    model = HallModel(reference_hall().subset_rows([0]))
    busy = model.present & (np.arange(model.n) % 7 == 3)
    view = view_of(model, busy)
    rise = view.rise_per_node(3500.0)
    problem = heat_problem(view, rise, n)
    best, winner = _brute_mpit(view, n, 3500.0)
    red = reduce(problem, best + PEAK_TOLERANCE_C)
    assert red is not None and red.floor <= best + 1e-12
    dropped = np.setdiff1d(np.arange(len(problem.base)), red.rows)
    heat = problem.heat[dropped]
    most = problem.base[dropped] + np.sort(heat, axis=1)[:, -n:].sum(axis=1)
    assert dropped.size and (most <= red.floor).all()  # a dropped row can never pass the floor
    forced = set(view.free_idx[red.forced].tolist())
    assert forced <= set(winner) <= forced | set(view.free_idx[red.open].tolist())
    assert red.k == n - len(red.forced) and len(red.open) < len(view.free_idx)


def _hot_reference_cases() -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(7)
    cases = [(np.zeros(40, bool), 20), (np.zeros(40, bool), 21)]
    for _ in range(4):
        busy = rng.random(40) < rng.uniform(0.0, 0.4)
        cases.append((busy, max(1, int((~busy).sum() * rng.uniform(0.3, 0.6)))))
    return cases


@pytest.mark.parametrize("case", range(6))
def test_mpit_matches_the_unreduced_milp_at_hot_sizes_on_the_reference_hall(case: int) -> None:
    """Too many subsets for brute force: the independent MILP (no reduction, no search) decides."""
    busy, n = _hot_reference_cases()[case]
    model = HallModel(reference_hall())
    view = view_of(model, busy)
    power = model.power.busy_w(0.2)
    rise = view.rise_per_node(power)
    chosen = create("mpit").choose(view, Request(n, power), 0)[0]
    problem = heat_problem(view, rise, n, whole=True)
    whole = Reduced.nothing(problem, float(problem.base.max()))
    upper = peak_after(view, rise, greedy(view, rise, n))
    found = solve_milp(problem, whole, upper, PEAK_TOLERANCE_C, time.monotonic() + 30)
    assert found is not None and found[1]
    assert chosen.tolist() == view.free_idx[found[0]].tolist()
