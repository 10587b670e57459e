"""MPIT's two-stage MILP (HiGHS via ``scipy.optimize.milp``), on a reduced problem.

The fallback of :mod:`.mpit_search` when its layered search outgrows its
budget (hard, unstructured D matrices), and the independent reference the
tests and the benchmark check the search against. x_j = 1 when undecided
column j joins the job; ``b`` is each kept row's load with the forced
columns in, ``h`` the undecided columns' heat on it:

    stage 1:  min t   s.t.  b_i + Σ_j h_ij x_j <= t,   Σ x_j = k,   floor <= t <= upper + tol
    stage 2:  min Σ_j cost_j x_j   s.t.  b_i + Σ_j h_ij x_j <= t* + tol,   Σ x_j = k

Costs are integers (:func:`services.allocator.policies.mpit.tie_costs`), so
HiGHS closes stage 2's gap exactly; sets equal on cost get HiGHS's answer
(the search, not this, applies the lexicographic last key).
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from services.allocator.model import Float64Array, IntArray
from services.allocator.policies.mpit_search import Problem, Reduced, restrict


def _peak(load: Float64Array, red: Reduced) -> float:
    return max(float(load.max(initial=-np.inf)), red.floor)


def solve_milp(
    problem: Problem, red: Reduced, upper: float, tol: float, deadline: float
) -> tuple[IntArray, bool] | None:
    """The answer's columns (sorted) and whether HiGHS proved both stages; None if it found nothing."""
    b, h, c = restrict(problem, red)
    m, k = len(red.open), red.k
    if k == 0 or k == m:
        return np.sort(np.r_[red.forced, red.open if k else red.open[:0]]), True
    h_sparse = sp.csr_matrix(h)
    proven, first = True, None
    t_star = red.floor
    if upper > red.floor + 1e-9:  # else the floor proves greedy's peak optimal: no stage 1
        stage1 = milp(
            c=np.r_[np.zeros(m), 1.0],
            constraints=[
                LinearConstraint(sp.hstack([h_sparse, -np.ones((len(b), 1))]).tocsr(), -np.inf, -b),
                LinearConstraint(np.r_[np.ones(m), 0.0][None, :], k, k),
            ],
            integrality=np.r_[np.ones(m), 0.0],
            bounds=Bounds(np.r_[np.zeros(m), red.floor], np.r_[np.ones(m), upper + tol]),
            options={"time_limit": max(0.01, deadline - time.monotonic()), "mip_rel_gap": 0.0},
        )
        if stage1.x is None:
            return None
        proven = stage1.status == 0
        first = stage1.x[:m] > 0.5
        t_star = min(upper, _peak(b + h[:, first].sum(axis=1), red))
    cheapest = np.argsort(c, kind="stable")[:k]
    if _peak(b + h[:, cheapest].sum(axis=1), red) <= t_star + tol:  # nothing costs less
        return np.sort(np.r_[red.forced, red.open[cheapest]]), proven
    stage2 = milp(
        c=c,
        constraints=[
            LinearConstraint(h_sparse, -np.inf, t_star + tol - b),
            LinearConstraint(np.ones((1, m)), k, k),
        ],
        integrality=np.ones(m),
        bounds=Bounds(0.0, 1.0),
        options={"time_limit": max(0.01, deadline - time.monotonic()), "mip_rel_gap": 0.0},
    )
    if stage2.x is None:
        return None if first is None else (np.sort(np.r_[red.forced, red.open[first]]), False)
    chosen = red.open[stage2.x > 0.5]
    return np.sort(np.r_[red.forced, chosen]), proven and stage2.status == 0
