"""MC1x1's shell scores from prefix sums against the shell matrix, on every kind of layout."""

from __future__ import annotations

import numpy as np
import pytest

from services.allocator.model import HallModel
from services.allocator.policies.shells import shell_scores
from services.common.thermal import Hall


@pytest.mark.parametrize("shape", [(3, 7, 1), (2, 5, 4), (5, 9, 3), (1, 30, 6), (6, 4, 2)])
@pytest.mark.parametrize("inter_row_distance", [0.0, 0.5, 2.5, 10.0])
def test_shell_scores_are_the_sums_of_the_nearest_shells(
    shape: tuple[int, int, int], inter_row_distance: float
) -> None:
    """One slot, fractional and zero row distances, rows that enter two at a time, centres
    that are not the free nodes: the same sums as the shell matrix gives."""
    rows, racks, slots = shape
    size = rows * racks * slots
    model = HallModel(
        Hall(rows, racks, slots, np.zeros((size, size)), inter_row_distance=inter_row_distance)
    )
    rng = np.random.default_rng(size)
    for _ in range(4):
        free = np.flatnonzero(rng.random(size) < rng.uniform(0.1, 1.0))
        if free.size == 0:
            continue
        centres = np.sort(rng.choice(model.n, max(1, size // 3), replace=False))
        for n in sorted({1, max(1, free.size // 3), free.size}):
            near = np.sort(model.shell_dist(free, free), axis=1)[:, :n].sum(axis=1)
            assert np.array_equal(shell_scores(model, free, n), near)
            near = np.sort(model.shell_dist(centres, free), axis=1)[:, :n].sum(axis=1)
            assert np.array_equal(shell_scores(model, free, n, centres), near)
