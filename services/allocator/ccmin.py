"""The exact ``CC_min(n)``: the smallest communication cost of any n nodes of an empty hall.

Why enumerating *compressed* sets is enough (the proof the tests check):

1. The pair sum splits per axis, and the axis-a term depends only on the
   a-coordinates of the nodes (see :mod:`.communication`).
2. *Compressing* a set along axis a replaces, on every line parallel to a,
   the nodes of that line by the centred interval of the same length (one
   fixed rounding for all lines, so intervals of different lengths are
   nested). The other coordinates of every node are unchanged, so the other
   axes' terms are unchanged. The axis-a term is a sum, over pairs of lines
   (u, v), of ``Σ_{s∈u, t∈v} |s - t|``; by the discrete rearrangement
   inequality of Hardy, Littlewood and Pólya (*Inequalities*, ch. X) with the
   symmetric decreasing kernel ``K - |d|``, nested centred intervals minimise
   every one of these sums at once. So compression never raises the cost.
3. Each non-trivial compression lowers ``Σ_nodes Σ_axes rank(coordinate)``
   (rank = position in centre-out order), so repeating it ends at a set that
   is compressed along every axis, no dearer than the start: a minimum is
   always reached among fully compressed sets.
4. Fully compressed sets are exactly the *plane partitions in the box*
   (after listing each axis in centre-out order): row k (centre-out) holds a
   partition λ^k of the rack x slot box — column heights non-increasing in
   centre-out rack order, each column the centred slot interval of its
   height — and λ^0 ⊇ λ^1 ⊇ ... . :func:`cc_min_table` enumerates every such
   chain and keeps the cheapest per size.

Steps 1–4 are checked against brute force over all 2^N subsets of halls of up
to 24 nodes (tests and ``docs/allocator.md``). Halls whose enumeration
exceeds a budget get the best of a partial enumeration and a greedy
construction, flagged ``exact = False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.allocator.communication import Float64Array

MAX_PARTITIONS = 5_000
"""Largest rack x slot box (in partitions, C(C+S, S)) enumerated exactly."""
DEFAULT_BUDGET = 2_000_000
"""Chains evaluated before giving up on exactness."""


@dataclass(frozen=True)
class CCMinTable:
    """``values[n]`` = CC_min(n) for n = 0..N; ``exact[n]`` says whether it is proven."""

    values: Float64Array
    exact: npt.NDArray[np.bool_]
    method: str


def centre_out(k: int) -> list[int]:
    """Positions 0..k-1 in the order centred intervals of growing length take them."""
    order: list[int] = []
    for length in range(1, k + 1):
        for p in centred(k, length):
            if p not in order:
                order.append(p)
    return order


def centred(k: int, length: int) -> range:
    """The centred interval of ``length`` positions in 0..k-1 (lower middle on ties)."""
    start = (k - length) // 2
    return range(start, start + length)


def _cum_cost(hist: npt.NDArray[np.int64], n: npt.NDArray[np.int64]) -> Float64Array:
    """Σ_g L_g (n - L_g) for each row of ``hist`` (unordered pair sum along one axis)."""
    lcum = np.cumsum(hist, axis=1)[:, :-1]
    return np.asarray((lcum * (n[:, None] - lcum)).sum(axis=1), dtype=np.float64)


def _partitions(c: int, s: int) -> npt.NDArray[np.int64]:
    """Non-increasing sequences of length c with values in 0..s (all partitions in a c x s box)."""
    out: list[tuple[int, ...]] = []

    def rec(prefix: list[int], cap: int) -> None:
        if len(prefix) == c:
            out.append(tuple(prefix))
            return
        for h in range(cap, -1, -1):
            prefix.append(h)
            rec(prefix, h)
            prefix.pop()

    rec([], s)
    return np.array(out, dtype=np.int64).reshape(len(out), c)


def cc_min_table(
    shape: tuple[int, int, int], weights: Float64Array, budget: int = DEFAULT_BUDGET
) -> CCMinTable:
    """CC_min(n) for every n on an empty ``rows x racks x slots`` box."""
    rows, racks, slots = shape
    n_nodes = rows * racks * slots
    best = np.full(n_nodes + 1, np.inf)
    best[0] = 0.0
    exact = False
    if math.comb(racks + slots, slots) <= MAX_PARTITIONS:
        exact = _enumerate(shape, weights, best, budget)
    if not exact:
        # Any set inside a sub-box is a set of the hall: an exact table of a
        # smaller box bounds the small sizes, where jobs live, from above.
        sub = _sub_box(shape)
        sub_best = np.full(sub[0] * sub[1] * sub[2] + 1, np.inf)
        _enumerate(sub, weights, sub_best, budget)
        best[: len(sub_best)] = np.minimum(best[: len(sub_best)], sub_best)
    best = np.minimum(best, _greedy_pair_sums(shape, weights))
    sizes = np.arange(n_nodes + 1, dtype=np.float64)
    values = np.where(sizes > 1, 2.0 * best / np.maximum(sizes, 1.0), 0.0)
    return CCMinTable(
        values=values,
        exact=np.full(n_nodes + 1, exact),
        method="plane-partition enumeration"
        if exact
        else "upper bound (sub-box enumeration, greedy)",
    )


def _sub_box(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    rows, racks, slots = shape
    slots = min(slots, 8)
    while math.comb(racks + slots, slots) > MAX_PARTITIONS:
        racks -= 1
    return min(rows, 2), racks, slots


def _enumerate(
    shape: tuple[int, int, int], weights: Float64Array, best: Float64Array, budget: int
) -> bool:
    rows, racks, slots = shape
    parts = _partitions(racks, slots)
    size = parts.sum(axis=1)
    rack_order, row_order = centre_out(racks), centre_out(rows)
    rack_hist = np.zeros((len(parts), racks), dtype=np.int64)
    rack_hist[:, rack_order] = parts
    slot_hist = np.zeros((len(parts), slots), dtype=np.int64)
    for h in range(1, slots + 1):
        slot_hist[:, list(centred(slots, h))] += (parts == h).sum(axis=1)[:, None]
    # contained[i]: partitions that fit inside partition i (the next row's candidates)
    contained = [np.flatnonzero((parts <= parts[i]).all(axis=1)) for i in range(len(parts))]
    everything = np.arange(len(parts))
    evaluated = 0

    def visit(
        level: int,
        children: npt.NDArray[np.int64],
        acc_rack: npt.NDArray[np.int64],
        acc_slot: npt.NDArray[np.int64],
        acc_rows: npt.NDArray[np.int64],
    ) -> bool:
        nonlocal evaluated
        evaluated += len(children)
        if evaluated > budget:
            return False
        n = acc_rows.sum() + size[children]
        row_hist = np.repeat(acc_rows[None, :], len(children), axis=0)
        row_hist[:, row_order[level]] = size[children]
        cost = (
            weights[0] * _cum_cost(row_hist, n)
            + weights[1] * _cum_cost(acc_rack + rack_hist[children], n)
            + weights[2] * _cum_cost(acc_slot + slot_hist[children], n)
        )
        np.minimum.at(best, n, cost)
        if level + 1 == rows:
            return True
        for child in children[size[children] > 0]:
            nxt = acc_rows.copy()
            nxt[row_order[level]] = size[child]
            ok = visit(
                level + 1,
                contained[child],
                acc_rack + rack_hist[child],
                acc_slot + slot_hist[child],
                nxt,
            )
            if not ok:
                return False
        return True

    zero_r, zero_s = np.zeros(racks, np.int64), np.zeros(slots, np.int64)
    return visit(0, everything, zero_r, zero_s, np.zeros(rows, np.int64))


def _greedy_pair_sums(shape: tuple[int, int, int], weights: Float64Array) -> Float64Array:
    """Upper bounds: grow a set from the centre, always adding the nearest node (ties: lowest index)."""
    rows, racks, slots = shape
    n_nodes = rows * racks * slots
    i = np.arange(n_nodes)
    pos = np.stack([i // (racks * slots), (i % (racks * slots)) // slots, i % slots], axis=1)
    start = (
        centre_out(rows)[0] * racks * slots + centre_out(racks)[0] * slots + centre_out(slots)[0]
    )
    # Per axis, the distance from every coordinate value to every node: one step adds three
    # rows of these tables (integers times the weights: exact in float64, in any order).
    tables = [
        weights[a] * np.abs(np.arange(extent)[:, None] - pos[None, :, a]).astype(np.float64)
        for a, extent in enumerate(shape)
    ]
    added = sum((tables[a][pos[start, a]] for a in range(3)), np.zeros(n_nodes))
    added[start] = np.inf
    out = np.full(n_nodes + 1, np.inf)
    out[0] = out[1] = 0.0
    total = 0.0
    for n in range(2, n_nodes + 1):
        j = int(np.argmin(added))
        total += float(added[j])
        r, k, s = pos[j]
        added += tables[0][r]
        added += tables[1][k]
        added += tables[2][s]
        added[j] = np.inf
        out[n] = total
    return out
