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
set so far, ties by index).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from services.allocator.communication import distance_matrix, distance_sums
from services.allocator.model import HallModel, IntArray
from services.allocator.policies.base import Policy, Request, View, distinct, register


def fill_from_shell(
    model: HallModel, inner: IntArray, shell: IntArray, need: int, exact_limit: int
) -> IntArray:
    """``inner`` plus the ``need`` nodes of ``shell`` that give the smallest CC."""
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
            combos = _combinations(len(shell), drop)
            # pair sum added = constant - Σ_out (to inner + to the whole shell) + Σ within out
            gain = (to_inner + among.sum(axis=1))[combos].sum(axis=1)
            within = among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
            cost = np.round(within - gain, 9)
            # the lexicographically smallest pick leaves out the lexicographically largest set
            out = combos[len(cost) - 1 - int(np.argmin(cost[::-1]))]
            pick = np.setdiff1d(np.arange(len(shell)), out)
        else:
            combos = _combinations(len(shell), need)
            # pair sum added = Σ distances to the inner nodes + Σ within the picked subset
            cost = to_inner[combos].sum(axis=1)
            cost = cost + among[combos[:, :, None], combos[:, None, :]].sum(axis=(1, 2)) / 2.0
            # lexicographic order of combinations makes argmin pick the lowest indices on ties
            pick = combos[int(np.argmin(np.round(cost, 9)))]
    else:
        added = to_inner.copy()
        taken = np.zeros(len(shell), dtype=bool)
        for _ in range(need):
            j = int(np.argmin(np.where(taken, np.inf, added)))
            taken[j] = True
            added += among[j]
        pick = np.flatnonzero(taken)
    return np.sort(np.r_[inner, shell[pick]])


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
    nodes = fill_from_shell(model, inner, shell, n - len(inner), exact_limit)
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
