"""MPIT's exact search: reduce the problem by bounds, then a layered branch-and-bound in numpy.

The problem, over the free nodes j and the present inlets i, with today's
inlets ``b_i`` and ``H_ij = D_ij ΔP_j >= 0`` (a node's heat on an inlet):

    stage 1:  t* = min over n-sets X of  max_i (b_i + Σ_{j in X} H_ij)
    stage 2:  among the sets whose peak is <= t* + tol, the least Σ cost_j,
              then the lexicographically smallest (sorted) set

Every step below keeps the answer exact. It rests on one fact: inlets only
grow as the set grows (H >= 0), so a row's load is bounded below by its
smallest contributions and above by its largest.

1. *Floor.* Every n-set adds at least the n smallest entries of each row, so
   ``t* >= floor = max(today's peak, max_i (b_i + n smallest of row i))``.
2. *Rows.* A row whose n largest entries keep it at or below the floor never
   sets a peak that matters (every peak is >= t* >= floor); it is dropped.
3. *Fixing.* ``limit`` = the greedy set's peak + tol >= t* + tol bounds the
   peak of every set that can be the answer. A node is left out if with it
   some row exceeds ``limit`` even when the rest are the smallest ones; a
   node is forced in if without it some row exceeds ``limit``. Repeated to a
   fixpoint.
4. *Dominance.* If node a heats every kept row no more than node b and costs
   less, swapping b for a never raises the peak and lowers the cost, so the
   answer never holds b without a (``x_b <= x_a``); swapping an optimal-peak
   set until no such pair is left also keeps its peak, so t* survives too.
5. *Layered branch-and-bound.* Nodes are decided in a fixed order (the
   hottest column first; the cheapest first once the floor proves the
   greedy peak). Layer L holds every assignment of the first L nodes that
   can still lead to the answer; one assignment is dropped when a row's
   load plus the r smallest entries of the undecided nodes exceeds the best
   complete peak so far + tol (r = nodes still to pick), when its cost plus
   the r cheapest undecided costs exceeds the cost of a set already known
   to tie (peak <= floor + tol; a cheapest-first fill seeds one, and if the
   k cheapest nodes fit, they are the answer at once), or when it breaks 4.
   All states of a layer share the same undecided nodes, so a layer's
   bounds are one look-up in tables built once: vectorised over the layer.

On the reference hall the widest layer holds a few dozen states. The search
gives up (returns None) when its tables would be too large, a layer
outgrows ``max_states`` or the deadline passes; the caller then falls back
to the MILP on the reduced problem.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.allocator.model import Float64Array, IntArray

DOMINANCE_MAX_ENTRIES = 20_000_000
"""Dominance pairs are looked for only while rows x nodes² stays below this (memory, time)."""
TABLE_MAX_ENTRIES = 4_000_000
"""The search runs only while its bound tables (nodes x rows x picks) stay below this (32 MB)."""


@dataclass(frozen=True)
class Problem:
    """MPIT on the rows that could matter: today's inlets, the free nodes' heat, stage-2 costs."""

    base: Float64Array
    """b_i: today's inlet of each row (the hottest row today among them)."""
    heat: Float64Array
    """H_ij >= 0: free node j's heat on row i (rows x free nodes)."""
    cost: Float64Array
    """Stage 2's integer cost of each free node."""
    n: int
    """Nodes the job takes."""


@dataclass(frozen=True)
class Reduced:
    """The problem after steps 1-3: kept rows, forced and undecided columns."""

    floor: float
    """A proven lower bound on t*: every set's peak is max(its kept-row peak, floor)."""
    rows: IntArray
    """Kept rows (indices into the problem's rows)."""
    forced: IntArray
    """Columns in every answer."""
    open: IntArray
    """Columns still undecided."""
    k: int
    """How many of ``open`` the answer takes."""

    @classmethod
    def nothing(cls, problem: Problem, floor: float) -> Reduced:
        """The whole problem, unreduced (``floor``: any proven lower bound, -inf if none)."""
        rows, cols = np.arange(problem.heat.shape[0]), np.arange(problem.heat.shape[1])
        return cls(floor, rows, cols[:0], cols, problem.n)


def _suffix_smallest(values: Float64Array, k: int) -> Float64Array:
    """(B, m) -> (m + 1, B, k + 1): [L, b, r] = sum of the r smallest of row b among columns L.. .

    Built backwards in O(m B k): the r smallest of a column v plus a suffix
    either skip v or take it with the r - 1 smallest of the suffix. inf where
    fewer than r columns are left.
    """
    rows, m = values.shape
    out = np.full((m + 1, rows, k + 1), np.inf)
    out[:, :, 0] = 0.0
    for col in range(m - 1, -1, -1):
        out[col, :, 1:] = np.minimum(out[col + 1, :, 1:], out[col + 1, :, :-1] + values[:, [col]])
    return out


def _smallest(values: Float64Array, count: int) -> tuple[Float64Array, Float64Array]:
    """Per row: the sum of the ``count`` smallest entries and the largest of them (-inf if none)."""
    if count <= 0:
        return np.zeros(len(values)), np.full(len(values), -np.inf)
    part = np.partition(values, count - 1, axis=1)[:, :count]
    return part.sum(axis=1), part[:, count - 1]


def restrict(problem: Problem, red: Reduced) -> tuple[Float64Array, Float64Array, Float64Array]:
    """Kept rows' loads with the forced columns in, the open columns' heat on them and costs."""
    heat = problem.heat
    start = problem.base[red.rows] + heat[np.ix_(red.rows, red.forced)].sum(axis=1)
    return start, heat[np.ix_(red.rows, red.open)], problem.cost[red.open]


def reduce(problem: Problem, limit: float) -> Reduced | None:
    """Steps 1-3; None if no n-set keeps every row within ``limit`` (cannot happen for a real bound)."""
    base, heat, n = problem.base, problem.heat, problem.n
    low = base + _smallest(heat, n)[0]
    high = base + _smallest(-heat, n)[0] * -1.0
    floor = max(float(base.max()), float(low.max()))
    rows = np.flatnonzero(high > floor)
    h, b = heat[rows], base[rows]
    open_ = np.arange(heat.shape[1])
    forced: list[int] = []
    while len(rows):
        k = n - len(forced)
        if k <= 0 or k >= len(open_):
            break
        sub = h[:, open_]
        load = (b + h[:, forced].sum(axis=1))[:, None]
        # with j: j plus the k-1 smallest others; without j: the k smallest others. A j
        # no larger than the k-th smallest is itself among the k smallest (by value).
        sum_k1, top_k1 = _smallest(sub, k - 1)
        sum_k, top_k = _smallest(sub, k)
        sum_k2 = sum_k + np.partition(sub, k, axis=1)[:, k]
        with_j = np.where(sub <= top_k1[:, None], sum_k[:, None], sum_k1[:, None] + sub)
        without_j = np.where(sub <= top_k[:, None], sum_k2[:, None] - sub, sum_k[:, None])
        out = ((load + with_j) > limit).any(axis=0)
        into = ((load + without_j) > limit).any(axis=0) & ~out
        if not (out.any() or into.any()):
            break
        forced.extend(open_[into].tolist())
        open_ = open_[~(out | into)]
    k = n - len(forced)
    if not 0 <= k <= len(open_):
        return None
    return Reduced(floor, rows, np.array(sorted(forced), dtype=np.int64), open_, k)


def _dominance(heat: Float64Array, cost: Float64Array) -> npt.NDArray[np.bool_]:
    """dom[a, b]: node a heats no kept row more than b and costs less (so x_b <= x_a)."""
    m = heat.shape[1]
    if heat.shape[0] * m * m > DOMINANCE_MAX_ENTRIES:
        return np.zeros((m, m), dtype=bool)
    cheaper = cost[:, None] < cost[None, :]
    for row in heat:
        cheaper &= row[:, None] <= row[None, :]
    return cheaper


def _cheap_fill(
    start: Float64Array, h: Float64Array, cost: Float64Array, k: int, cap: float
) -> float:
    """Cost of a set kept within ``cap``: columns in cost order, each taken if it fits (inf if < k)."""
    load = start.copy()
    spent, taken = 0.0, 0
    for j in np.argsort(cost, kind="stable").tolist():
        if (load + h[:, j] <= cap).all():
            load += h[:, j]
            spent += float(cost[j])
            taken += 1
            if taken == k:
                return spent
    return float("inf")


def layered_search(
    problem: Problem, red: Reduced, upper: float, tol: float, max_states: int, deadline: float
) -> IntArray | None:
    """Step 4-5 on a reduced problem: the answer's columns (sorted), or None when over budget."""
    k = red.k
    start, h, c = restrict(problem, red)
    if k == 0 or k == len(red.open):
        return np.sort(np.r_[red.forced, red.open[:k] if k == 0 else red.open])
    if upper <= red.floor + tol:  # stage 1 settled: only cost decides, cheapest first
        order = np.argsort(c, kind="stable")
    else:  # the hottest columns first: deciding them early makes the heat bounds bite
        hottest = h.max(axis=0) if len(h) else np.zeros(len(red.open))
        order = np.lexsort((c, -hottest))
    cols, h, c = red.open[order], h[:, order], c[order]
    m = len(cols)
    # a set within floor + tol surely ties with the optimum: its cost prunes from the start
    best_cost = _cheap_fill(start, h, c, k, red.floor + tol)
    if best_cost == np.sort(c)[:k].sum():  # the k cheapest columns fit: nothing can beat them
        return np.sort(np.r_[red.forced, cols[np.argsort(c, kind="stable")[:k]]])
    if (len(h) + 1) * (m + 1) * (k + 1) > TABLE_MAX_ENTRIES:
        return None
    dom = _dominance(h, c)
    heat_left = _suffix_smallest(h, k)
    cost_left = _suffix_smallest(c[None, :], k)[:, 0, :]
    # the frontier: picked count, kept-row loads, cost, which columns were taken
    picked = np.zeros(1, dtype=np.int64)
    load = start[None, :]
    spent = np.zeros(1)
    taken = np.zeros((1, m), dtype=bool)
    for level in range(m):
        need_in = np.flatnonzero(dom[:level, level])  # earlier nodes that dominate this one
        need_out = np.flatnonzero(dom[level, :level])  # earlier nodes this one dominates
        can_in = taken[:, need_in].all(axis=1) & (picked < k)
        can_out = ~taken[:, need_out].any(axis=1)
        picked = np.r_[picked[can_in] + 1, picked[can_out]]
        load = np.vstack([load[can_in] + h[:, level], load[can_out]])
        spent = np.r_[spent[can_in] + c[level], spent[can_out]]
        taken = np.vstack([taken[can_in], taken[can_out]])
        taken[: int(can_in.sum()), level] = True
        left = k - picked
        rest = m - level - 1
        peak = np.maximum(load.max(axis=1, initial=-np.inf), red.floor)
        done = left == 0
        if done.any():
            upper = min(upper, float(peak[done].min()))
            sure = done & (peak <= red.floor + tol)
            if sure.any():
                best_cost = min(best_cost, float(spent[sure].min()))
        bound = load + heat_left[level + 1][:, np.minimum(left, rest)].T
        cheapest = cost_left[level + 1, np.minimum(left, rest)]
        keep = (left <= rest) & (spent + cheapest <= best_cost)
        keep &= bound.max(axis=1, initial=red.floor) <= upper + tol
        picked, load, spent, taken = picked[keep], load[keep], spent[keep], taken[keep]
        if not 0 < len(picked) <= max_states or time.monotonic() > deadline:
            return None  # (an empty layer cannot happen but for rounding: the MILP decides)
    peak = np.maximum(load.max(axis=1, initial=-np.inf), red.floor)
    tied = peak <= float(peak.min()) + tol
    cheapest_sets = taken[tied & (spent == spent[tied].min())]
    sets = [tuple(sorted(np.r_[red.forced, cols[row]].tolist())) for row in cheapest_sets]
    return np.array(min(sets), dtype=np.int64)
