"""MPIT: place the job where the hall's peak inlet temperature stays lowest.

Exact, busy nodes fixed; x_j = 1 when free node j joins the job, ΔP_j its
power rise. As a mixed-integer program:

    stage 1:  min t   s.t.  Tin_i + Σ_j D_ij ΔP_j x_j <= t  (every present i),  Σ x_j = n
    stage 2:  min Σ_j (q_j M + j) x_j   s.t.  Tin_i + Σ_j D_ij ΔP_j x_j <= t* + 0.1 mK,  Σ x_j = n

Stage 2 is the tie rule: among the sets whose peak is within 0.1 mK of the
optimum (a margin above HiGHS's 1e-6 optimality gap, so the rule does not
depend on solver settings), the one adding the least total inlet rise over
the hall (``q_j = floor(1000 Σ_i D_ij ΔP_j)``, in mK), then the smallest sum
of node indices (``M = n N + 1`` keeps the two apart), then the
lexicographically smallest set.

How it is solved, cheapest first, every step exact:

1. :func:`keeps_peak`: the peak can never drop below today's, so when the
   cheapest admissible nodes keep today's peak they answer both stages
   (O(nnz of D), the usual case).
2. The greedy answer bounds the peak from above; :mod:`.mpit_search` drops
   the rows and fixes the nodes that bounds rule out and solves the rest by
   a layered branch-and-bound in numpy (a few ms on the reference hall,
   where HiGHS needed up to ~30 ms of CPU for half-hall jobs).
3. If that search outgrows its state budget (large or unstructured halls),
   :mod:`.mpit_milp` solves the reduced MILP with HiGHS
   (``scipy.optimize.milp``) in the time left; sets equal on every key but
   the last then get HiGHS's answer.

Above ``mpit_exact_max_free`` free nodes only step 1 runs; if it does not
settle the job (or HiGHS fails or times out) the heuristic decides: greedy,
adding each time the node whose column raises the peak least (same tie
keys), scanning only D's non-zeros. Runner-ups are the best single swaps
(one chosen node out, one free node in) of the choice.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from services.allocator.model import Float64Array, IntArray
from services.allocator.policies.base import (
    PEAK_TOLERANCE_C,
    Policy,
    Request,
    View,
    distinct,
    register,
)
from services.allocator.policies.mpit_greedy import greedy_positions
from services.allocator.policies.mpit_milp import solve_milp
from services.allocator.policies.mpit_search import Problem, Reduced, layered_search, reduce

SEARCH_MAX_STATES = 2_000
"""The layered search hands over to the MILP when a layer holds more states (tens on real halls)."""
SWAP_OUT_LIMIT = 32
SWAP_IN_LIMIT = 64


def total_rise_mk(view: View, rise: Float64Array, nodes: IntArray) -> Float64Array:
    """q_j: total inlet rise over present nodes caused by node j joining, in whole mK."""
    return np.floor(1000.0 * view.model.col_sums[nodes] * rise[nodes])


def peak_after(view: View, rise: Float64Array, nodes: IntArray) -> float:
    """max Tin over present nodes once ``nodes`` draw the job's power."""
    tin = view.inlet_c + view.model.inlet_rise(nodes, rise)
    return float(tin.max())


class _Columns:
    """D's columns scaled by each node's power rise, for O(nnz) peak scans of the free nodes.

    Kept in D's own layout (column j is node j; busy nodes' columns are there but
    never asked), in arrays the model lends to one decision at a time.
    """

    def __init__(self, view: View, rise: Float64Array) -> None:
        model = view.model
        d = model.d_csc
        self.free = view.free_idx
        self.monotone = bool(rise[self.free].min() >= 0) if self.free.size else True
        self._data, self._work = model.scratch(self)
        np.take(rise, model.entry_cols, out=self._data)
        self._data *= d.data
        self._heat = sp.csc_matrix((self._data, d.indices, d.indptr), shape=d.shape)
        self._today: Float64Array | None = None
        self.view = view

    @property
    def heat(self) -> sp.csc_matrix:
        """Column j: node j's heat into every inlet (D's column j times its power rise)."""
        self._check()
        return self._heat

    def _check(self) -> None:
        if not self.view.model.lent_to(self):
            raise RuntimeError("MPIT's columns of an earlier decision were reused by another")

    def today(self) -> Float64Array:
        """For each free node: the hall's peak inlet if that node alone joined, floored at
        today's peak (the shortcut and greedy both start from it)."""
        if self._today is None:
            self._check()
            model, tin = self.view.model, self.view.inlet_c
            floor = float(tin.max())
            out = np.full(model.n, floor)
            cols, starts = model.nonempty_cols
            if cols.size:
                values = np.take(tin, model.d_csc.indices, out=self._work)
                values += self._data
                out[cols] = np.maximum(floor, np.maximum.reduceat(values, starts))
            self._today = out[self.free]
        return self._today


def _cheapest_within(
    view: View, rise: Float64Array, cols: _Columns, cost: Float64Array, n: int, bound: float
) -> IntArray | None:
    """The n cheapest nodes that each keep the peak within ``bound``, if together they do too.

    Every set feasible for stage 2 consists of such nodes, so when the cheapest
    n of them are feasible together they are stage 2's optimum: no MILP needed.
    This is the common case (a job that does not move the hall's hot spot).
    """
    ok = np.flatnonzero(cols.today() <= bound)
    if len(ok) < n:
        return None
    pick = ok[np.argsort(cost[ok], kind="stable")[:n]]
    nodes = np.sort(cols.free[pick])
    return nodes if peak_after(view, rise, nodes) <= bound else None


def tie_costs(view: View, rise: Float64Array, n: int) -> Float64Array:
    """Stage 2's integer cost per free node: ``q_j M + j`` (total rise in mK, then index)."""
    free = view.free_idx
    return _free_rise_mk(view, rise) * (n * view.model.n + 1) + free


def _memo(view: View, what: str, rise: Float64Array, make: Any) -> Any:
    """``make()`` once per decision and power rise (the shortcut and greedy share these)."""
    hit = view.memo.get(what)
    if hit is None or hit[0] is not rise:
        hit = view.memo[what] = (rise, make())
    return hit[1]


def _columns(view: View, rise: Float64Array) -> _Columns:
    cols: _Columns = _memo(view, "mpit-columns", rise, lambda: _Columns(view, rise))
    return cols


def _free_rise_mk(view: View, rise: Float64Array) -> Float64Array:
    q: Float64Array = _memo(
        view, "mpit-rise", rise, lambda: total_rise_mk(view, rise, view.free_idx)
    )
    return q


def keeps_peak(view: View, rise: Float64Array, n: int) -> IntArray | None:
    """The exact MPIT answer when some set keeps today's peak (the usual case), else None.

    The peak can never drop below today's (D >= 0, powers only rise), so a set
    that keeps it is optimal for stage 1, and the cheapest admissible one is
    stage 2's answer. O(nnz of D), whatever the hall's size.
    """
    quick, keeps = _within_today(view, rise, n)
    return quick if keeps else None


def _within_today(view: View, rise: Float64Array, n: int) -> tuple[IntArray | None, bool]:
    """Stage 2's answer if t* were today's peak (or None), and whether it keeps today's peak."""
    now = float(view.inlet_c.max())
    cost = tie_costs(view, rise, n)
    quick = _cheapest_within(view, rise, _columns(view, rise), cost, n, now + PEAK_TOLERANCE_C)
    return quick, quick is not None and peak_after(view, rise, quick) <= now


def heat_problem(view: View, rise: Float64Array, n: int, whole: bool = False) -> Problem:
    """Today's inlets, the free nodes' heat (dense) and stage-2 costs, on the rows that could matter.

    A row that stays at or below today's peak with every free node busy never
    decides anything; the hottest row today is kept so that ``b.max()`` is
    today's peak (the search's floor relies on it). ``whole``: every present row.
    """
    free = view.free_idx
    tin = view.inlet_c
    cols = view.model.d_csc[:, free] @ sp.diags(rise[free])
    present = view.model.present
    if whole:
        rows = np.flatnonzero(present)
    else:
        reach = tin + np.asarray(cols.sum(axis=1)).ravel()
        rows = np.union1d(np.flatnonzero(present & (reach > tin.max())), [int(np.argmax(tin))])
    heat = np.asarray(cols.tocsr()[rows].toarray())
    return Problem(tin[rows], heat, tie_costs(view, rise, n), n)


def solve_exact(
    view: View, rise: Float64Array, n: int, time_limit_s: float, max_states: int = SEARCH_MAX_STATES
) -> tuple[IntArray, bool]:
    """The exact answer within ``time_limit_s``: (nodes, proven optimal).

    :func:`keeps_peak` first; then the greedy answer bounds the peak from
    above, :func:`.mpit_search.reduce` shrinks the problem and the layered
    search solves it (proven); past ``max_states`` states the two-stage MILP
    solves the reduced problem in the time left (proven unless it times out,
    and never worse than greedy).
    """
    deadline = time.monotonic() + time_limit_s
    free = view.free_idx
    monotone = bool(rise[free].min() >= 0)  # else a job drawing less than idle: inlets can fall
    quick, keeps = _within_today(view, rise, n) if monotone else (None, False)
    if keeps and quick is not None:
        return quick, True
    upper = greedy(view, rise, n)
    t_high = peak_after(view, rise, upper)
    if quick is not None and t_high <= float(view.inlet_c.max()):
        return quick, True  # greedy proves t* = today's peak, so quick answers stage 2
    problem = heat_problem(view, rise, n, whole=not monotone)
    if monotone:
        red = reduce(problem, t_high + PEAK_TOLERANCE_C)
        if red is None:  # only by rounding: greedy's own set is within the limit
            return upper, False
        found = layered_search(problem, red, t_high, PEAK_TOLERANCE_C, max_states, deadline)
        if found is not None:
            return free[found], True
    else:  # no bound holds: the MILP on the whole problem
        red = Reduced.nothing(problem, -np.inf)
    solved = solve_milp(problem, red, t_high, PEAK_TOLERANCE_C, deadline)
    if solved is None or peak_after(view, rise, free[solved[0]]) > t_high + PEAK_TOLERANCE_C:
        return upper, False
    return free[solved[0]], solved[1]


def greedy(view: View, rise: Float64Array, n: int) -> IntArray:
    """Add, n times, the free node that raises the peak least (ties: least total rise, index).

    A lazy heap's order (a node's candidate peak only grows as the job grows,
    so stale keys are lower bounds), with the steps that leave the peak where
    it is taken in numpy chunks: :mod:`.mpit_greedy`.
    """
    cols = _columns(view, rise)
    by_rank = np.lexsort((cols.free, _free_rise_mk(view, rise)))
    today = cols.today()
    picks = greedy_positions(
        cols.heat, cols.free, view.inlet_c.copy(), today, by_rank, n, cols.monotone
    )
    return np.sort(cols.free[np.array(picks, dtype=np.int64)])


def swap_runner_ups(view: View, rise: Float64Array, chosen: IntArray, k: int) -> list[IntArray]:
    """The ``k`` best sets one swap away from ``chosen``, by resulting peak.

    Only the rows the swapped nodes heat can change; every other row enters as
    one constant, so the cost follows D's non-zeros, not the hall's size.
    """
    if k <= 0:
        return []
    d = view.model.d_csc
    outside = np.setdiff1d(view.free_idx, chosen)
    if outside.size == 0:
        return []
    tin = view.inlet_c + view.model.inlet_rise(chosen, rise)
    hot = int(np.argmax(tin))
    hot_row = np.asarray(view.model.d_csr[hot, chosen].toarray()).ravel()
    outs = chosen[np.argsort(-hot_row * rise[chosen], kind="stable")][:SWAP_OUT_LIMIT]
    ins = outside[np.argsort(total_rise_mk(view, rise, outside), kind="stable")][:SWAP_IN_LIMIT]
    cols = d[:, np.r_[outs, ins]].tocsr()
    rows = np.flatnonzero(np.diff(cols.indptr))
    block = np.asarray(cols[rows].toarray()) * rise[np.r_[outs, ins]]
    rest = np.delete(tin, rows)
    floor = float(rest.max()) if rest.size else -np.inf
    add = block[:, len(outs) :]
    peaks = np.full((len(outs), len(ins)), floor)
    if rows.size:
        for a in range(len(outs)):
            base = tin[rows] - block[:, a]
            peaks[a] = np.maximum((base[:, None] + add).max(axis=0), floor)
    # by peak, then the node swapped out, then the one swapped in
    us, vs = np.repeat(outs, len(ins)), np.tile(ins, len(outs))
    best = np.lexsort((vs, us, peaks.ravel()))[: 4 * k]
    sets = [np.sort(np.r_[chosen[chosen != us[i]], vs[i]]) for i in best.tolist()]
    return distinct(sets, k)


@register
class Mpit(Policy):
    """Minimise the peak inlet temperature (exact search + MILP, greedy above a size limit)."""

    name = "mpit"
    summary = "minimise the hall's peak inlet temperature (exact; greedy on huge halls)"

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        rise = view.rise_per_node(request.power_w)
        n = request.size
        chosen: IntArray | None
        if len(view.free_idx) > self.options.mpit_exact_max_free:
            chosen = keeps_peak(view, rise, n)
        else:  # never worse than greedy: greedy's peak bounds the exact solver from above
            chosen = solve_exact(view, rise, n, self.options.mpit_time_limit_s)[0]
        if chosen is None:
            chosen = greedy(view, rise, n)
        return [chosen, *swap_runner_ups(view, rise, chosen, alternatives)]
