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


class ShellHeat:
    """Peak inlets of candidate fills, to break ties between equally compact ones.

    Built once per decision from the view and each free node's power rise.
    Only the rows a shell's nodes heat can differ between two fills of that
    shell; the rest of the hall enters as one constant floor.
    """

    MAX_ENTRIES = 4_000_000
    """Rows x fills x picks evaluated at once (bounded memory)."""

    def __init__(self, view: View, rise: Float64Array) -> None:
        self.view = view
        self.rise = rise

    def setup(self, inner: IntArray, shell: IntArray) -> tuple[Float64Array, Float64Array, float]:
        """(inlets of the touched rows with ``inner`` busy, their heat from each shell node, floor)."""
        d = self.view.model.d_csc
        base = self.view.inlet_c + d[:, inner] @ self.rise[inner]
        cols = (d[:, shell] @ sp.diags(self.rise[shell])).tocsr()
        rows = np.flatnonzero(np.diff(cols.indptr))
        if rows.size == 0:
            rows = np.array([int(np.argmax(base))])
        rest = base.copy()
        rest[rows] = -np.inf
        return base[rows], np.asarray(cols[rows].toarray()), float(rest.max())

    def peaks(
        self, inner: IntArray, shell: IntArray, combos: IntArray, left_out: bool = False
    ) -> Float64Array:
        """The hall's peak inlet for each fill (``combos``: shell positions picked, or left out)."""
        base, heat, floor = self.setup(inner, shell)
        total = heat.sum(axis=1)
        out = np.empty(len(combos))
        step = max(1, self.MAX_ENTRIES // max(1, heat.shape[0] * combos.shape[1]))
        for a in range(0, len(combos), step):
            part = heat[:, combos[a : a + step]].sum(axis=2)
            added = total[:, None] - part if left_out else part
            out[a : a + step] = (base[:, None] + added).max(axis=0)
        return np.maximum(out, floor)


def _coolest(costs: Float64Array, peaks: Callable[[IntArray], Float64Array] | None) -> int:
    """Index of the cheapest cost; ties to the lowest peak (when given), then the first."""
    best = np.flatnonzero(costs == costs.min())
    if peaks is None or len(best) == 1:
        return int(best[0])
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
    is given (peaks within 0.1 mK are equal), then to the lowest indices.
    """
    if need <= 0:
        return np.sort(inner)
    if need >= len(shell):
        return np.sort(np.r_[inner, shell])
    w = model.weights
    to_inner = distance_sums(model.pos[shell], model.pos[inner], w)
    among = distance_matrix(model.pos[shell], model.pos[shell], w)
    if math.comb(len(shell), need) <= exact_limit:
        drop = len(shell) - need
        if drop < need:  # enumerate the few left out: the same order of costs, less work
            # the lexicographically smallest pick leaves out the lexicographically largest
            # set: enumerate the left-out sets from the largest down
            combos = _combinations(len(shell), drop)[::-1]
            # pair sum added = constant - Σ_out (to inner + to the whole shell) + Σ within out
            gain = (to_inner + among.sum(axis=1))[combos].sum(axis=1)
            within = among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
            cost = np.round(within - gain, 9)
            tie = None if heat is None else (lambda k: heat.peaks(inner, shell, combos[k], True))
            out = combos[_coolest(cost, tie)]
            pick = np.setdiff1d(np.arange(len(shell)), out)
        else:
            combos = _combinations(len(shell), need)
            # pair sum added = Σ distances to the inner nodes + Σ within the picked subset
            cost = to_inner[combos].sum(axis=1)
            cost = cost + among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
            # lexicographic order of combinations makes the first tie the lowest indices
            tie = None if heat is None else (lambda k: heat.peaks(inner, shell, combos[k]))
            pick = combos[_coolest(np.round(cost, 9), tie)]
    else:
        pick = _greedy_fill(to_inner, among, need, None if heat is None else (heat, inner, shell))
    return np.sort(np.r_[inner, shell[pick]])


def _greedy_fill(
    to_inner: Float64Array,
    among: Float64Array,
    need: int,
    heat: tuple[ShellHeat, IntArray, IntArray] | None,
) -> IntArray:
    """Add the shell node nearest to the set so far, ``need`` times (ties: coolest, lowest)."""
    added = to_inner.copy()
    taken = np.zeros(len(added), dtype=bool)
    if heat is not None:
        base, cols, floor = heat[0].setup(heat[1], heat[2])
    for _ in range(need):
        cost = np.round(np.where(taken, np.inf, added), 9)
        best = np.flatnonzero(cost == cost.min())
        j = int(best[0])
        if heat is not None and len(best) > 1:
            peaks = np.maximum((base[:, None] + cols[:, best]).max(axis=0), floor)
            j = int(best[int(np.argmin(np.round(peaks / PEAK_TOLERANCE_C)))])
        if heat is not None:
            base = base + cols[:, j]
        taken[j] = True
        added += among[j]
    return np.flatnonzero(taken)


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
    dist = model.shells[centre, free]
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
        shells = model.shells[np.ix_(free, free)]
        score = np.partition(shells, n - 1, axis=1)[:, :n].sum(axis=1)
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
