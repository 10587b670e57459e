"""MPIT: place the job where the hall's peak inlet temperature stays lowest.

Exact, as a mixed-integer program solved by HiGHS (``scipy.optimize.milp``),
busy nodes fixed; x_j = 1 when free node j joins the job, ΔP_j its power rise:

    stage 1:  min t   s.t.  Tin_i + Σ_j D_ij ΔP_j x_j <= t  (every present i),  Σ x_j = n
    stage 2:  min Σ_j (q_j M + j) x_j   s.t.  Tin_i + Σ_j D_ij ΔP_j x_j <= t* + 1e-6,  Σ x_j = n

Stage 2 is the tie rule: among the sets whose peak is within 1 µK of the
optimum, the one adding the least total inlet rise over the hall
(``q_j = floor(1000 Σ_i D_ij ΔP_j)``, in mK), then the smallest sum of node
indices (``M = n N + 1`` keeps the two apart; integer costs, so HiGHS closes
the gap exactly).

Above ``mpit_exact_max_free`` free nodes (or if HiGHS fails or times out) the
heuristic runs: greedy, adding each time the node whose column raises the
peak least (same tie keys), scanning only D's non-zeros (O(nnz) per step).
Runner-ups are the best single swaps (one chosen node out, one free node in)
of the choice.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from services.allocator.model import Float64Array, IntArray
from services.allocator.policies.base import Policy, Request, View, distinct, register

PEAK_TOLERANCE_C = 1e-6
SWAP_OUT_LIMIT = 32
SWAP_IN_LIMIT = 64


def total_rise_mk(view: View, rise: Float64Array, nodes: IntArray) -> Float64Array:
    """q_j: total inlet rise over present nodes caused by node j joining, in whole mK."""
    colsum = np.asarray(view.model.d_csc[:, nodes].sum(axis=0)).ravel()
    return np.floor(1000.0 * colsum * rise[nodes])


def peak_after(view: View, rise: Float64Array, nodes: IntArray) -> float:
    """max Tin over present nodes once ``nodes`` draw the job's power."""
    tin = view.inlet_c + view.model.d_rows[:, nodes] @ rise[nodes]
    return float(tin.max())


def solve_exact(
    view: View, rise: Float64Array, n: int, time_limit_s: float
) -> tuple[IntArray, bool] | None:
    """The two-stage MILP; (nodes, proven optimal) or None when HiGHS found nothing."""
    free = view.free_idx
    m = len(free)
    rows = np.flatnonzero(view.model.present)
    base = view.inlet_c[rows]
    heat = sp.csr_matrix(view.model.d_csc[:, free][rows, :] @ sp.diags(rise[free]))
    ones = sp.csr_matrix(np.ones((rows.size, 1)))
    count_row = sp.csr_matrix(np.r_[np.ones(m), 0.0][None, :])
    stage1 = milp(
        c=np.r_[np.zeros(m), 1.0],
        constraints=[
            LinearConstraint(sp.hstack([heat, -ones]).tocsr(), -np.inf, -base),
            LinearConstraint(count_row, n, n),
        ],
        integrality=np.r_[np.ones(m), 0.0],
        bounds=Bounds(np.r_[np.zeros(m), -np.inf], np.r_[np.ones(m), np.inf]),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if stage1.x is None:
        return None
    first = free[np.flatnonzero(stage1.x[:m] > 0.5)]
    t_star = peak_after(view, rise, first)
    cost = total_rise_mk(view, rise, free) * (n * view.model.n + 1) + free
    stage2 = milp(
        c=cost,
        constraints=[
            LinearConstraint(heat, -np.inf, t_star + PEAK_TOLERANCE_C - base),
            LinearConstraint(np.ones((1, m)), n, n),
        ],
        integrality=np.ones(m),
        bounds=Bounds(0.0, 1.0),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if stage2.x is None:
        return np.sort(first), stage1.status == 0
    chosen = np.sort(free[np.flatnonzero(stage2.x > 0.5)])
    return chosen, stage1.status == 0 and stage2.status == 0


def greedy(view: View, rise: Float64Array, n: int) -> IntArray:
    """Add, n times, the free node that raises the peak least (ties: least total rise, index)."""
    free = view.free_idx
    cols = view.model.d_csc[:, free].tocsc()
    cols.sort_indices()
    indptr, indices = cols.indptr, cols.indices
    per_nz_rise = np.repeat(rise[free], np.diff(indptr))
    data = cols.data * per_nz_rise
    nonempty = np.diff(indptr) > 0
    starts = indptr[:-1][nonempty]
    q = total_rise_mk(view, rise, free)
    tin = view.inlet_c.copy()
    peak = float(tin.max())
    available = np.ones(len(free), dtype=bool)
    chosen: list[int] = []
    for _ in range(n):
        col_peak = np.full(len(free), peak)
        if data.size:
            col_peak[nonempty] = np.maximum(peak, np.maximum.reduceat(tin[indices] + data, starts))
        key_peak = np.where(available, np.round(col_peak, 9), np.inf)
        j = int(np.lexsort((free, q, key_peak))[0])
        a, b = indptr[j], indptr[j + 1]
        tin[indices[a:b]] += data[a:b]
        peak = float(tin.max())
        available[j] = False
        chosen.append(int(free[j]))
    return np.sort(np.array(chosen, dtype=np.int64))


def swap_runner_ups(view: View, rise: Float64Array, chosen: IntArray, k: int) -> list[IntArray]:
    """The ``k`` best sets one swap away from ``chosen``, by resulting peak."""
    if k <= 0:
        return []
    d = view.model.d_rows
    outside = np.setdiff1d(view.free_idx, chosen)
    if outside.size == 0:
        return []
    tin = view.inlet_c + d[:, chosen] @ rise[chosen]
    hot = int(np.argmax(tin))
    outs = chosen[np.argsort(-d[hot, chosen] * rise[chosen], kind="stable")][:SWAP_OUT_LIMIT]
    ins = outside[np.argsort(total_rise_mk(view, rise, outside), kind="stable")][:SWAP_IN_LIMIT]
    add = d[:, ins] * rise[ins]
    scored: list[tuple[float, int, int]] = []
    for u in outs.tolist():
        base = tin - d[:, u] * rise[u]
        peaks = (base[:, None] + add).max(axis=0)
        scored.extend((float(p), u, int(v)) for p, v in zip(peaks, ins, strict=True))
    scored.sort()
    sets = [np.sort(np.r_[chosen[chosen != u], v]) for _, u, v in scored[: 4 * k]]
    return distinct(sets, k)


@register
class Mpit(Policy):
    """Minimise the peak inlet temperature (exact MILP, greedy above a size limit)."""

    name = "mpit"
    summary = "minimise the hall's peak inlet temperature (exact MILP; greedy on huge halls)"

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        rise = view.rise_per_node(request.power_w)
        n = request.size
        chosen: IntArray | None = None
        if len(view.free_idx) <= self.options.mpit_exact_max_free:
            found = solve_exact(view, rise, n, self.options.mpit_time_limit_s)
            if found is not None:
                chosen, optimal = found
                if not optimal:
                    alt = greedy(view, rise, n)
                    if peak_after(view, rise, alt) < peak_after(view, rise, chosen):
                        chosen = alt
        if chosen is None:
            chosen = greedy(view, rise, n)
        return [chosen, *swap_runner_ups(view, rise, chosen, alternatives)]
