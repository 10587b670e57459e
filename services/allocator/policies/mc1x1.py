"""MC1x1: keep the job compact, for communication (shells grown around a centre).

Every free node is a candidate centre. Shell k around centre c holds the
nodes at shell distance k: ``max(|Δrack|, |Δslot|, ceil(inter_row_distance
|Δrow|))`` — square shells 1x1, 3x3, 5x5, ... in the rack x slot plane, with
the other rows entering only after ``inter_row_distance`` shells (crossing
rows costs that many hops). A centre takes its n free nodes from the
innermost shells; its score is the sum of their shell indices. The lowest
score wins; equal scores go to the lower CC, then to the lower centre index
(CC is computed for at most ``mc_tie_limit`` tied centres, lowest indices
first). All free nodes of the inner shells are taken; from the outermost
shell the subset that minimises the job's CC is chosen — exactly when at most
``mc_exact_fill_limit`` subsets exist, else greedily (nearest node to the
set so far). Equally compact subsets go to the lowest indices, or, when the
caller passes a :class:`ShellHeat` (the joint policy), to the lowest peak
inlet first, as the paper breaks such ties.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from services.allocator.communication import distance_matrix, distance_sums
from services.allocator.model import Float64Array, HallModel, IntArray
from services.allocator.policies.base import (
    PEAK_TOLERANCE_C,
    Policy,
    Request,
    View,
    distinct,
    register,
)
from services.allocator.policies.shells import shell_scores

GREEDY_WORK_LIMIT = 250_000
"""A greedy fill costs ``need x shell`` distance updates; above this (big jobs on big halls)
the shell's nodes nearest to the inner ones are taken instead, one sort."""


class ShellHeat:
    """Peak inlets of candidate fills, to break ties between equally compact ones.

    Built once per decision from the view and each free node's power rise. A
    fill only adds heat, so its peak is ``max(today's peak with the inner
    nodes busy, the rows its nodes heat)``: the cost follows D's non-zeros in
    the shell's columns, never the hall's size.
    """

    MAX_TIES = 512
    """Equally compact fills compared at most (the lowest first)."""

    def __init__(self, view: View, rise: Float64Array) -> None:
        self.view = view
        self.rise = rise
        self._base: tuple[bytes, Float64Array] | None = None
        self._cols: tuple[bytes, sp.csc_matrix] | None = None

    def base(self, inner: IntArray) -> Float64Array:
        """Every inlet once ``inner`` is busy (absent nodes at -inf)."""
        key = inner.tobytes()
        if self._base is None or self._base[0] != key:
            rise = self.view.model.inlet_rise(inner, self.rise)
            self._base = (key, self.view.inlet_c + rise)
        return self._base[1]

    def add_many(self, base: Float64Array, shell: IntArray, nodes: IntArray) -> None:
        """``base`` += the heat of ``nodes`` (positions in ``shell``), in place."""
        idx = self._segments(self._columns(shell), nodes)[0]
        heat = self._columns(shell)
        np.add.at(base, heat.indices[idx], heat.data[idx])

    @staticmethod
    def _segments(heat: sp.csc_matrix, nodes: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """(positions in heat's data of ``nodes``' columns, each column's length, its first)."""
        starts, lengths = heat.indptr[nodes], heat.indptr[nodes + 1] - heat.indptr[nodes]
        first = np.cumsum(lengths) - lengths
        idx = np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()))
        return idx, lengths, first

    def _columns(self, shell: IntArray) -> sp.csc_matrix:
        """The shell's heat columns (D's columns times each node's power rise), once per shell."""
        key = shell.tobytes()
        if self._cols is None or self._cols[0] != key:
            heat = self.view.model.d_csc[:, shell]  # a copy, scaled in place
            heat.data *= np.repeat(self.rise[shell], np.diff(heat.indptr))
            self._cols = (key, heat)
        return self._cols[1]

    def single_peaks(self, base: Float64Array, shell: IntArray, nodes: IntArray) -> Float64Array:
        """The hall's peak if each one of ``nodes`` (positions in ``shell``) alone joined."""
        heat = self._columns(shell)
        top = float(base.max())
        idx, lengths, first = self._segments(heat, nodes)
        out = np.full(len(nodes), top)
        filled = lengths > 0
        if filled.any():
            values = base[heat.indices[idx]] + heat.data[idx]
            out[filled] = np.maximum(np.maximum.reduceat(values, first[filled]), top)
        return out

    def peaks_on(self, base: Float64Array, shell: IntArray, picks: IntArray) -> Float64Array:
        """The hall's peak for each row of ``picks`` (positions in ``shell``) added to ``base``."""
        if picks.shape[1] == 1:
            return self.single_peaks(base, shell, picks[:, 0])
        top = float(base.max())
        heat = self._columns(shell)
        t, k = picks.shape
        which = sp.csc_matrix(
            (np.ones(t * k), (picks.ravel(), np.repeat(np.arange(t), k))), shape=(len(shell), t)
        )
        added = sp.csc_matrix(heat @ which)
        out = np.full(t, top)
        filled = np.diff(added.indptr) > 0
        if filled.any():
            values = base[added.indices] + added.data
            tops = np.maximum.reduceat(values, added.indptr[:-1][filled])
            out[filled] = np.maximum(tops, top)
        return out

    def peaks(self, inner: IntArray, shell: IntArray, picks: IntArray) -> Float64Array:
        return self.peaks_on(self.base(inner), shell, picks)


def _coolest(costs: Float64Array, peaks: Callable[[IntArray], Float64Array] | None) -> int:
    """Index of the cheapest cost; ties to the lowest peak (when given), then the first."""
    best = np.flatnonzero(costs == costs.min())
    if peaks is None or len(best) == 1:
        return int(best[0])
    best = best[: ShellHeat.MAX_TIES]
    binned = np.round(peaks(best) / PEAK_TOLERANCE_C)
    return int(best[int(np.argmin(binned))])


def fill_from_shell(
    model: HallModel,
    inner: IntArray,
    shell: IntArray,
    need: int,
    exact_limit: int,
    heat: ShellHeat | None = None,
) -> IntArray:
    """``inner`` plus the ``need`` nodes of ``shell`` that give the smallest CC.

    Equally compact fills go to the one with the lowest peak inlet when ``heat``
    is given (peaks within 0.1 mK are equal; at most ``MAX_TIES`` compared), then
    to the lowest indices.
    """
    if need <= 0:
        return np.sort(inner)
    if need >= len(shell):
        return np.sort(np.r_[inner, shell])
    w = model.weights
    to_inner = distance_sums(model.pos[shell], model.pos[inner], w)
    hot = None if heat is None else (heat, inner, shell)
    if math.comb(len(shell), need) <= exact_limit:
        pick = _exact_fill(model, shell, need, to_inner, hot)
    elif need * len(shell) <= GREEDY_WORK_LIMIT:
        among = distance_matrix(model.pos[shell], model.pos[shell], w)
        pick = _greedy_fill(to_inner, among, need, hot)
    else:
        pick = _nearest_fill(to_inner, need, hot)
    return np.sort(np.r_[inner, shell[pick]])


Heat = tuple[ShellHeat, IntArray, IntArray] | None
"""The tie-breaker with the fill's inner nodes and shell, or None (lowest indices)."""


def _exact_fill(
    model: HallModel, shell: IntArray, need: int, to_inner: Float64Array, heat: Heat
) -> IntArray:
    """The cheapest of every ``need``-subset of the shell."""
    among = distance_matrix(model.pos[shell], model.pos[shell], model.weights)
    everything = np.arange(len(shell))
    drop = len(shell) - need
    if drop < need:  # enumerate the few left out: the same order of costs, less work
        # the lexicographically smallest pick leaves out the lexicographically largest
        # set: enumerate the left-out sets from the largest down
        combos = _combinations(len(shell), drop)[::-1]
        # pair sum added = constant - Σ_out (to inner + to the whole shell) + Σ within out
        gain = (to_inner + among.sum(axis=1))[combos].sum(axis=1)
        within = among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
        cost = np.round(within - gain, 9)

        def kept(k: IntArray) -> IntArray:
            return np.array([np.setdiff1d(everything, combos[i]) for i in k.tolist()])

        out = combos[_coolest(cost, _tie(heat, kept))]
        return np.setdiff1d(everything, out)
    combos = _combinations(len(shell), need)
    # pair sum added = Σ distances to the inner nodes + Σ within the picked subset
    cost = to_inner[combos].sum(axis=1)
    cost = cost + among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
    # lexicographic order of combinations makes the first tie the lowest indices
    picked: IntArray = combos[_coolest(np.round(cost, 9), _tie(heat, lambda k: combos[k]))]
    return picked


def _tie(
    heat: Heat, picks: Callable[[IntArray], IntArray]
) -> Callable[[IntArray], Float64Array] | None:
    if heat is None:
        return None
    h, inner, shell = heat
    return lambda k: h.peaks(inner, shell, picks(k))


def _greedy_fill(to_inner: Float64Array, among: Float64Array, need: int, heat: Heat) -> IntArray:
    """Add the shell node nearest to the set so far, ``need`` times (ties: coolest, lowest)."""
    added = to_inner.copy()
    taken: list[int] = []
    pending: list[int] = []  # taken since the tie-breaker's inlets were last brought up to date
    base: Float64Array | None = None  # the tie-breaker's inlets, from the first tie on
    # whole distances (integer weights) stay whole numbers far below 2^53 / 1e9, which
    # round(·, 9) returns unchanged: then the costs need no rounding at every step
    whole = _whole(added) and _whole(among)
    whole = whole and float(added.max() + need * among.max()) < 1e6
    for _ in range(need):
        cost = added if whole else np.round(added, 9)  # taken nodes are at inf
        j = int(cost.argmin())  # the first of the cheapest
        if heat is not None:
            best = np.flatnonzero(cost == cost[j])
            if len(best) > 1:
                h, inner, shell = heat
                if base is None:
                    base = h.base(inner).copy()
                if pending:
                    h.add_many(base, shell, np.array(pending))
                    pending.clear()
                best = best[: ShellHeat.MAX_TIES]
                peaks = h.peaks_on(base, shell, best[:, None])
                j = int(best[int(np.argmin(np.round(peaks / PEAK_TOLERANCE_C)))])
        taken.append(j)
        pending.append(j)
        added += among[j]
        added[j] = np.inf
    return np.sort(np.array(taken, dtype=np.int64))


def _whole(values: Float64Array) -> bool:
    return bool(np.array_equal(values, np.floor(values)))


def _nearest_fill(to_inner: Float64Array, need: int, heat: Heat) -> IntArray:
    """The ``need`` shell nodes nearest to the inner nodes (ties at the cut: coolest alone,
    then lowest)."""
    near = np.round(to_inner, 9)
    order = np.argsort(near, kind="stable")
    if heat is None or need >= len(order):
        return np.sort(order[:need])
    cut = near[order[need - 1]]
    tied = np.flatnonzero(near == cut)  # ascending positions: lowest first
    before = order[:need][near[order[:need]] < cut]
    if len(tied) <= need - len(before):
        return np.sort(order[:need])
    h, inner, shell = heat
    tied = tied[: ShellHeat.MAX_TIES]
    alone = h.peaks(inner, shell, tied[:, None])
    best = tied[np.lexsort((tied, np.round(alone / PEAK_TOLERANCE_C)))]
    return np.sort(np.r_[before, best[: need - len(before)]])


@functools.lru_cache(maxsize=64)
def _combinations(size: int, need: int) -> IntArray:
    """All ``need``-subsets of ``range(size)`` in lexicographic order (shared, read-only)."""
    combos = np.array(list(itertools.combinations(range(size), need)), dtype=np.int64)
    combos.flags.writeable = False
    return combos


Fills = dict[tuple[bytes, bytes], IntArray]
"""Allocations already filled in one decision, by (inner nodes, outermost shell)."""


def allocation_at(
    model: HallModel,
    free: IntArray,
    centre: int,
    n: int,
    exact_limit: int,
    fills: Fills | None = None,
    heat: ShellHeat | None = None,
) -> IntArray:
    """The MC1x1 allocation of ``n`` nodes around ``centre`` (a free node).

    Centres whose inner shells and outermost shell hold the same nodes get
    the same allocation; ``fills`` (one dict per decision) computes it once.
    """
    dist = model.shell_dist(centre, free)[0]
    kth = np.partition(dist, n - 1)[n - 1]
    inner = free[dist < kth]
    shell = free[dist == kth]
    key = (inner.tobytes(), shell.tobytes())
    if fills is not None and key in fills:
        return fills[key]
    nodes = fill_from_shell(model, inner, shell, n - len(inner), exact_limit, heat)
    if fills is not None:
        fills[key] = nodes
    return nodes


@register
class Mc1x1(Policy):
    """Minimise communication: the most compact shell allocation."""

    name = "mc1x1"
    summary = "compact placement: square shells around the best centre (communication-aware)"

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        model, free, n = view.model, view.free_idx, request.size
        score = shell_scores(model, free, n)
        order = np.lexsort((free, score))
        best = score[order[0]]
        tied = order[score[order] == best][: self.options.mc_tie_limit]
        ranked: list[tuple[float, int, IntArray]] = []
        fills: Fills = {}
        limit = self.options.mc_exact_fill_limit
        for k in tied.tolist():
            nodes = allocation_at(model, free, int(free[k]), n, limit, fills)
            ranked.append((round(model.cc(nodes), 9), int(free[k]), nodes))
        ranked.sort(key=lambda r: (r[0], r[1]))
        candidates = [r[2] for r in ranked]
        if len(candidates) <= alternatives:
            for k in order[len(tied) : len(tied) + 2 * alternatives + 2].tolist():
                candidates.append(allocation_at(model, free, int(free[k]), n, limit, fills))
        return distinct(candidates, alternatives + 1)
