"""Policies: MPIT's heuristic and runner-ups, MC1x1 shells, joint, baselines, the registry.

MPIT's exactness against brute force is in ``test_policies_mpit.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from services.allocator.model import HallModel
from services.allocator.policies import REGISTRY, PolicyOptions, Request, View, create
from services.allocator.policies.mc1x1 import ShellHeat, fill_from_shell
from services.allocator.policies.mpit import (
    PEAK_TOLERANCE_C,
    greedy,
    keeps_peak,
    peak_after,
)
from services.common.errors import ConfigError
from services.common.thermal import reference_hall
from tests.allocator.policy_halls import random_hall, view_of


def test_mpit_heuristic_above_the_size_limit_is_valid_and_close() -> None:
    model = HallModel(random_hall(7, 2, 3, 3))
    busy = np.zeros(model.n, bool)
    busy[[0, 5, 9]] = True
    view = view_of(model, busy)
    heuristic = create("mpit", PolicyOptions(mpit_exact_max_free=0))
    exact = create("mpit")
    rise = view.rise_per_node(3500.0)
    for n in (2, 4, 6):
        h = heuristic.choose(view, Request(n, 3500.0), 0)[0]
        e = exact.choose(view, Request(n, 3500.0), 0)[0]
        assert len(set(h.tolist())) == n and not busy[h].any()
        settled = keeps_peak(view, rise, n)
        assert np.array_equal(h, greedy(view, rise, n) if settled is None else settled)
        assert peak_after(view, rise, h) >= peak_after(view, rise, e) - 1e-6


def test_mpit_runner_ups_are_distinct_swaps_no_better_than_the_choice() -> None:
    model = HallModel(reference_hall())
    view = view_of(model, np.zeros(40, bool))
    sets = create("mpit").choose(view, Request(5, 3500.0), 3)
    assert len(sets) == 4
    assert len({tuple(s.tolist()) for s in sets}) == 4
    rise = view.rise_per_node(3500.0)
    best = peak_after(view, rise, sets[0])
    for s in sets[1:]:
        assert len(np.setdiff1d(s, sets[0])) == 1
        assert peak_after(view, rise, s) >= best - 1e-6


def test_mc1x1_takes_the_lowest_corner_square_on_an_empty_row() -> None:
    model = HallModel(reference_hall().subset_rows([0]))
    view = view_of(model, np.zeros(40, bool))
    chosen = create("mc1x1").choose(view, Request(4, 3500.0), 0)[0]
    assert chosen.tolist() == [0, 1, 4, 5]
    assert model.cc(chosen) == pytest.approx(4.0)


def test_mc1x1_fills_the_outer_shell_with_the_cheapest_subset() -> None:
    model = HallModel(reference_hall())
    inner = np.array([5, 6])
    shell = np.array([0, 1, 2, 3, 4, 7, 8, 9, 10, 11])
    got = fill_from_shell(model, inner, shell, 3, exact_limit=10_000)
    best = min(model.cc(np.r_[inner, list(c)]) for c in itertools.combinations(shell.tolist(), 3))
    assert model.cc(got) == pytest.approx(best)
    greedy_fill = fill_from_shell(model, inner, shell, 3, exact_limit=0)
    assert len(greedy_fill) == 5 and model.cc(greedy_fill) >= best - 1e-9


@pytest.mark.parametrize("need", range(1, 10))
def test_mc1x1_shell_fill_takes_the_first_cheapest_subset_at_every_size(need: int) -> None:
    """Picks of more than half the shell enumerate the left-out nodes instead: same answer."""
    model = HallModel(reference_hall())
    inner = np.array([5, 6])
    shell = np.array([0, 1, 2, 3, 4, 7, 8, 9, 10, 11])
    got = fill_from_shell(model, inner, shell, need, exact_limit=10_000)
    costs = [
        (round(model.cc(np.r_[inner, c]), 9), c)
        for c in itertools.combinations(shell.tolist(), need)
    ]
    best = min(cost for cost, _ in costs)
    first = next(c for cost, c in costs if cost == best)  # lowest indices among ties
    assert got.tolist() == sorted([*inner.tolist(), *first])


def test_mc1x1_is_more_compact_than_mpit_and_joint_is_cooler_than_mc1x1() -> None:
    model = HallModel(reference_hall().subset_rows([0]))
    busy = np.zeros(40, bool)
    busy[[0, 1, 4, 5]] = True
    view = view_of(model, busy)
    rise = view.rise_per_node(3500.0)
    req = Request(5, 3500.0)
    mc = create("mc1x1").choose(view, req, 0)[0]
    mp = create("mpit").choose(view, req, 0)[0]
    jt = create("joint").choose(view, req, 0)[0]
    assert model.cc(mc) <= model.cc(mp)
    assert model.cc(mc) <= model.cc(jt)
    assert peak_after(view, rise, mp) <= peak_after(view, rise, jt) + 1e-9
    assert peak_after(view, rise, jt) <= peak_after(view, rise, mc) + 1e-9


def test_joint_candidates_are_shells_at_mpit_nodes() -> None:
    model = HallModel(reference_hall())
    view = view_of(model, np.zeros(40, bool))
    req = Request(6, 3500.0)
    sets = create("joint").choose(view, req, 10)
    rise = view.rise_per_node(3500.0)
    peaks = [round(peak_after(view, rise, s) / PEAK_TOLERANCE_C) for s in sets]
    assert peaks == sorted(peaks)
    mpit_nodes = set(create("mpit").choose(view, req, 0)[0].tolist())
    assert all(set(s.tolist()) & mpit_nodes for s in sets)


def _best_joint_by_brute_force(view: View, request: Request) -> list[int]:
    """Every equally compact fill of every MPIT centre's outermost shell; the paper's order.

    Lowest peak inlet first (peaks within 0.1 mK are equal), then the lower CC,
    then the lower centre; among a centre's equally compact fills, the coolest.
    """
    model, free, n = view.model, view.free_idx, request.size
    rise = view.rise_per_node(request.power_w)
    best: tuple[int, float, int, list[int]] | None = None
    for c in create("mpit").choose(view, request, 0)[0].tolist():
        dist = model.shells[c, free]
        kth = np.sort(dist)[n - 1]
        inner, shell = free[dist < kth], free[dist == kth]
        fills = [np.r_[inner, list(x)] for x in itertools.combinations(shell, n - len(inner))]
        cc = min(round(model.cc(f), 9) for f in fills)
        for f in fills:
            if round(model.cc(f), 9) == cc:
                key = (round(peak_after(view, rise, f) / PEAK_TOLERANCE_C), cc, c, sorted(f))
                best = key if best is None or key < best else best
    assert best is not None
    return best[3]


@pytest.mark.parametrize(
    ("rows", "busy", "size", "before"),
    [
        # equally compact (CC 6.4): 21.52 °C before, 21.40 °C available
        ([0], [3, 7, 8, 9, 14], 5, [1, 2, 5, 6, 10]),
        # the same peak (22.72 °C): CC 4.0 before, 2.67 (the minimum for 3 nodes) available
        ([1], [22, 26, 27, 28, 29, 31, 36], 3, [21, 23, 25]),
        ([0, 1], [0, 2, 4, 7, 8, 13, 19, 20, 23, 26, 36], 5, [22, 25, 27, 30, 31]),
    ],
)
def test_joint_breaks_ties_between_equally_compact_fills_by_peak_inlet(
    rows: list[int], busy: list[int], size: int, before: list[int]
) -> None:
    """The paper's tie rule; before it, the lowest node indices won (issue 14)."""
    model = HallModel(reference_hall().subset_rows(rows))
    mask = np.zeros(40, bool)
    mask[busy] = True
    view = view_of(model, mask)
    request = Request(size, 3500.0)
    got = create("joint").choose(view, request, 0)[0].tolist()
    assert got == _best_joint_by_brute_force(view, request)
    assert got != before
    rise = view.rise_per_node(3500.0)
    old, new = (peak_after(view, rise, np.array(x)) for x in (before, got))
    assert new < old - PEAK_TOLERANCE_C or (
        new <= old + PEAK_TOLERANCE_C and model.cc(got) < model.cc(before) - 1e-9
    )


def test_joint_matches_brute_force_over_random_occupancies() -> None:
    rng = np.random.default_rng(14)
    for rows in ([0], [1], [0, 1]):
        model = HallModel(reference_hall().subset_rows(rows))
        for _ in range(12):
            mask = (rng.random(40) < rng.uniform(0.0, 0.6)) & model.present
            view = view_of(model, mask)
            size = int(rng.integers(2, min(7, len(view.free_idx)) + 1))
            request = Request(size, 3500.0)
            got = create("joint").choose(view, request, 0)[0].tolist()
            assert got == _best_joint_by_brute_force(view, request)


def test_shell_fill_breaks_cc_ties_by_peak_in_the_greedy_path_too() -> None:
    model = HallModel(reference_hall())
    view = view_of(model, np.zeros(40, bool))
    rise = view.rise_per_node(3500.0)
    inner, shell = np.array([1]), np.array([0, 2, 4, 5, 6])  # node 1 and its first shell
    heat = ShellHeat(view, rise)
    exact = fill_from_shell(model, inner, shell, 1, 10_000, heat)
    greedy_fill = fill_from_shell(model, inner, shell, 1, 0, heat)
    # nodes 0, 2 and 5 are one hop from node 1: equally compact; node 2 keeps it coolest
    peaks = {j: peak_after(view, rise, np.array([1, j])) for j in (0, 2, 5)}
    assert min(peaks, key=peaks.__getitem__) == 2
    assert peaks[0] > peaks[2] + PEAK_TOLERANCE_C
    assert exact.tolist() == greedy_fill.tolist() == [1, 2]
    assert fill_from_shell(model, inner, shell, 1, 0).tolist() == [0, 1]  # without: lowest index


def test_first_fit_and_random_baselines() -> None:
    model = HallModel(reference_hall())
    busy = np.zeros(40, bool)
    busy[[0, 2]] = True
    view = view_of(model, busy)
    ff = create("first-fit").choose(view, Request(3, 3500.0), 2)
    assert [s.tolist() for s in ff] == [[1, 3, 4], [3, 4, 5], [4, 5, 6]]
    a = create("random", PolicyOptions(seed=5)).choose(view, Request(6, 3500.0), 2)
    b = create("random", PolicyOptions(seed=5)).choose(view, Request(6, 3500.0), 2)
    c = create("random", PolicyOptions(seed=6)).choose(view, Request(6, 3500.0), 2)
    assert [s.tolist() for s in a] == [s.tolist() for s in b]
    assert [s.tolist() for s in a] != [s.tolist() for s in c]
    assert not any(busy[s].any() for s in a)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_returns_free_sets_of_the_right_size(name: str) -> None:
    model = HallModel(reference_hall())
    rng = np.random.default_rng(9)
    for _ in range(5):
        busy = rng.random(40) < 0.5
        view = view_of(model, busy)
        n = int(rng.integers(1, len(view.free_idx) + 1))
        sets = create(name).choose(view, Request(n, 3300.0), 2)
        assert sets
        for s in sets:
            assert len(s) == n == len(set(s.tolist())) and not busy[s].any()


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="expected one of first-fit, joint, mc1x1, mpit, random"):
        create("coolest")
