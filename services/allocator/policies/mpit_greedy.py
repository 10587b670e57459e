"""MPIT's greedy heuristic: n times, the free node that raises the hall's peak inlet least.

The order is a lazy heap's (keys: the peak if the node joined, rounded to
1e-9 K; ties by tie rank: total rise, then index), and this module keeps its
choices bit for bit while taking most steps in numpy. What the heap does,
stated exactly: each step takes the node with the least ``(e_j, rank_j)``,
``e_j = max(s_j, f_j)``, where ``s_j`` is its first key (numpy-rounded) and
``f_j = round(max(peak, M_j), 9)`` its key now (Python-rounded), ``M_j`` the
highest inlet its column would make. With heat only added, ``e_j`` never
falls, so the nodes tied at the lowest ``e`` (for a big job: the thousands
that leave the peak where it is) are taken in rank order, each unless the
ones before it pushed its ``e`` up. :func:`_level` takes them in chunks: a
chunk's inlets with every one of its nodes added bound every inlet on the
way (floating-point addition of non-negative heat is monotone), so a node
whose rows all stay within the level by that bound is taken without a
look; the others, the few near the hot spot, are checked one by one on the
rows that could decide. Whatever the level leaves goes back to the heap.
"""

from __future__ import annotations

import heapq

import numpy as np
import scipy.sparse as sp

from services.allocator.model import Float64Array, IntArray

LEVEL_MIN = 64
"""Below this many nodes at the lowest key, the heap alone (chunks would not pay off)."""
CHUNK_START, CHUNK_MIN, CHUNK_MAX = 256, 32, 4096


def round9(x: Float64Array) -> Float64Array:
    """``round(v, 9)`` of every element, as Python rounds (correctly, half to even).

    ``np.round`` rounds ``fl(v * 1e9)``, which differs from Python only where
    that product lies within an ulp of a half: those few go through Python.
    """
    out = np.round(x, 9)
    z = x * 1e9
    with np.errstate(invalid="ignore"):
        doubt = np.abs(z - np.floor(z) - 0.5) <= 2.0 * np.spacing(np.abs(z))
        doubt |= ~(np.abs(x) < 1e6)  # huge or not finite: Python decides
    if doubt.any():
        where = np.flatnonzero(doubt)
        out[where] = [round(v, 9) for v in x[where].tolist()]
    return out


def greedy_positions(
    heat: sp.csc_matrix,
    columns: IntArray,
    tin: Float64Array,
    start: Float64Array,
    by_rank: IntArray,
    n: int,
    monotone: bool,
) -> list[int]:
    """Positions (into ``columns``, the free nodes) of the n greedy picks, in pick order.

    ``heat``: column ``columns[j]`` is node j's heat into every inlet (D's column times
    its power rise; canonical CSC); ``tin``: today's inlets (absent nodes at -inf),
    updated in place; ``start``: each node's peak if it alone joined, at least today's
    peak; ``by_rank``: the positions in tie order; ``monotone``: no node's heat is
    negative (then chunks are exact; else the heap alone, as always).
    """
    first = np.round(start, 9)  # the heap's first keys, as they always were
    level_of = np.maximum(first, round9(start))  # e_j before any step
    peak = round(float(tin.max()), 9)  # only the rounded peak ever decides
    keys = first.copy()
    chosen: list[int] = []
    if monotone:  # e never falls: levels are exact
        low = float(level_of.min())
        level = by_rank[level_of[by_rank] == low]
        if len(level) >= LEVEL_MIN:
            peak = _level(heat, columns, tin, level, low, peak, n, chosen, keys)
    if len(chosen) < n:
        _heap(heat, columns, tin, keys, by_rank, peak, n, chosen)
    return chosen


def _level(
    heat: sp.csc_matrix,
    columns: IntArray,
    tin: Float64Array,
    level: IntArray,
    low: float,
    peak: float,
    n: int,
    chosen: list[int],
    keys: Float64Array,
) -> float:
    """Take the nodes of ``level`` (all at key ``low``, in rank order) that stay there.

    Appends to ``chosen``; a node pushed above the level gets its new key in
    ``keys``; returns the rounded peak.
    """
    at, size = 0, CHUNK_START
    hot_flag = np.zeros(len(tin), dtype=bool)
    while at < len(level) and len(chosen) < n:
        chunk = level[at : at + min(size, n - len(chosen))]
        at += len(chunk)
        part = heat[:, columns[chunk]]
        ptr, rows, add = part.indptr, part.indices, part.data
        bound = tin.copy()
        np.add.at(bound, rows, add)  # sequential: the exact inlets if the whole chunk is taken
        over = np.flatnonzero(bound > peak)  # at or below the rounded peak: within the level
        hot_rows = over[round9(bound[over]) > peak]
        if hot_rows.size == 0:
            tin[:] = bound
            chosen.extend(chunk.tolist())
            size = min(2 * size, CHUNK_MAX)
            continue
        hot_flag[hot_rows] = True
        hot = np.flatnonzero(hot_flag[rows])  # the entries in hot rows
        hot_flag[hot_rows] = False
        owner = np.searchsorted(ptr[1:], hot, side="right")  # the chunk position of each hot entry
        risky, cut = np.unique(owner, return_index=True)
        taken = np.ones(len(chunk), dtype=bool)
        # the hot rows' inlets as Python floats (the same IEEE doubles, without numpy's
        # per-call cost): the only rows that could lift a node above the level
        hot_rows, local = np.unique(rows[hot], return_inverse=True)
        now = tin[hot_rows].tolist()
        where, what = local.tolist(), add[hot].tolist()
        bounds = np.r_[cut, len(hot)].tolist()
        for k, c in enumerate(risky.tolist()):
            span = range(bounds[k], bounds[k + 1])
            fresh = max(peak, round(max([now[where[e]] + what[e] for e in span]), 9))
            if fresh <= low:  # its first key is at most the level's: e = fresh
                for e in span:
                    now[where[e]] += what[e]
                peak = max(peak, fresh)
            else:
                taken[c] = False
                keys[chunk[c]] = fresh
        tin[hot_rows] = now
        cool = np.ones(len(rows), dtype=bool)
        cool[hot] = False
        cool &= np.repeat(taken, np.diff(ptr))
        np.add.at(tin, rows[cool], add[cool])  # hot rows are up to date already
        chosen.extend(chunk[taken].tolist())
        if len(risky) * 8 > len(chunk):
            size = max(size // 2, CHUNK_MIN)
    return peak


def _heap(
    heat: sp.csc_matrix,
    columns: IntArray,
    tin: Float64Array,
    keys: Float64Array,
    by_rank: IntArray,
    peak: float,
    n: int,
    chosen: list[int],
) -> None:
    """The lazy heap, from where ``chosen`` stands: a node's key only grows, so stale keys are
    lower bounds and a popped node whose key is still its key is the least."""
    left = np.ones(len(keys), dtype=bool)
    left[chosen] = False
    ranks = np.flatnonzero(left[by_rank])  # tie ranks of the nodes left
    heap = list(zip(keys[by_rank[ranks]].tolist(), ranks.tolist(), strict=True))
    heapq.heapify(heap)
    firsts = heat.indptr[columns].tolist()
    lasts = heat.indptr[columns + 1].tolist()
    position = by_rank.tolist()
    indices, data = heat.indices, heat.data
    pop, push = heapq.heappop, heapq.heappush
    while len(chosen) < n:
        key, r = pop(heap)
        j = position[r]
        a, b = firsts[j], lasts[j]
        if b > a:
            rows, add = indices[a:b], data[a:b]
            fresh = round(max(peak, float((tin[rows] + add).max())), 9)
        else:
            fresh = round(peak, 9)
        if fresh > key:
            push(heap, (fresh, r))
            continue
        if b > a:
            tin[rows] += add
        peak = max(peak, fresh)
        chosen.append(j)
