"""MC1x1's shell scores for every centre at once, from prefix sums of the free nodes.

Shell k around a centre holds the nodes at ``max(|Δrack|, |Δslot|,
ceil(inter_row_distance |Δrow|)) = k``, so the nodes within shell k form a
box in (row, rack, slot), and a centre's score, the sum of its ``n``
smallest shell indices to free nodes, is ``Σ_{k >= 0} (n - min(n, c_k))``
with ``c_k`` the free nodes in that box. Counting ``c_k`` from prefix sums
costs O(centres · max shell) instead of the free x free shell matrix
(400 MB at 10,000 nodes).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from services.allocator.model import HallModel, IntArray

BLOCK = 16
"""Shells counted together (a centres x BLOCK array) once every slot is in reach."""


def shell_scores(
    model: HallModel, free: IntArray, n: int, centres: IntArray | None = None
) -> npt.NDArray[np.int64]:
    """Each centre's MC1x1 score: the sum of its ``n`` smallest shell indices to free nodes
    (``centres``: the free nodes unless given).

    The first ``slots - 1`` shells count 3-D boxes (8 corners of a 3-D prefix
    sum); from then on every box spans all slots, so it is a 2-D box over
    (row, rack) of the slot sums, and its rows change only where a new row
    comes within reach: for a run of shells with the same rows, ``c_k`` is two
    lookups in one prefix sum over racks, for many k at once. ``n - min(n, c_k)``
    is 0 from a centre's last shell on (``c_k`` only grows), so a block may run past it.
    """
    hall = model.hall
    shape = (hall.rows, hall.racks, hall.slots)
    grid = np.zeros(model.n, dtype=np.int64)
    grid[free] = 1
    grid3 = grid.reshape(shape)
    # the same ceil(inter_row_distance * |Δrow|) as HallModel.shell_dist, so counts agree exactly
    row_shell = np.ceil(hall.inter_row_distance * np.abs(np.arange(shape[0])))
    pos = model.pos[free if centres is None else centres]
    score = np.zeros(len(pos), dtype=np.int64)
    active = np.arange(len(pos))
    k = 0
    if shape[2] > 1:
        prefix = np.zeros(tuple(x + 1 for x in shape), dtype=np.int64)
        prefix[1:, 1:, 1:] = grid3.cumsum(0).cumsum(1).cumsum(2)
        while active.size and k < shape[2] - 1:
            count = _box_counts(prefix, shape, pos[active], _reach(row_shell, k), k)
            score[active] += n - np.minimum(count, n)
            active = active[count < n]
            k += 1
    # every slot within reach from here on: boxes over (row, rack) of the slot sums
    by_rows = np.zeros((shape[0] + 1, shape[1]), dtype=np.int64)
    by_rows[1:] = grid3.sum(axis=2).cumsum(axis=0)
    rows = np.arange(shape[0])
    row_at = (pos[:, 0] * (shape[1] + 1)).astype(np.int32)
    rack = pos[:, 1].astype(np.int32)
    while active.size:
        dr = _reach(row_shell, k)
        end = int(row_shell[dr + 1]) if dr + 1 < shape[0] else np.iinfo(np.int64).max
        # along[r, c]: free nodes in racks < c of the rows within dr of row r
        window = by_rows[np.minimum(rows + dr + 1, shape[0])] - by_rows[np.maximum(rows - dr, 0)]
        along = np.zeros((shape[0], shape[1] + 1), dtype=np.int32)  # counts < 2^31
        along[:, 1:] = window.cumsum(axis=1)
        flat = along.ravel()
        while active.size and k < end:
            ks = np.arange(k, min(end, k + BLOCK), dtype=np.int32)
            at = row_at[active, None]  # the start of each centre's row in ``flat``
            c = rack[active, None]
            count = flat[at + np.minimum(c + ks + 1, shape[1])] - flat[at + np.maximum(c - ks, 0)]
            score[active] += (n - np.minimum(count, n)).sum(axis=1)
            active = active[count[:, -1] < n]
            k = int(ks[-1]) + 1
    return score


def _reach(row_shell: npt.NDArray[np.float64], k: int) -> int:
    """The largest row distance within shell k."""
    return int((row_shell <= k).sum()) - 1


def _box_counts(
    prefix: npt.NDArray[np.int64], shape: tuple[int, int, int], p: IntArray, dr: int, k: int
) -> npt.NDArray[np.int64]:
    """Free nodes within ``dr`` rows and ``k`` racks and slots of each position, 8 corners."""
    flat = prefix.ravel()
    stride_r, stride_c = (shape[1] + 1) * (shape[2] + 1), shape[2] + 1
    lo = [np.maximum(p[:, 0] - dr, 0), np.maximum(p[:, 1] - k, 0), np.maximum(p[:, 2] - k, 0)]
    hi = [np.minimum(p[:, a] + d + 1, shape[a]) for a, d in enumerate((dr, k, k))]
    count = np.zeros(len(p), dtype=np.int64)
    for cr in (0, 1):
        for cc in (0, 1):
            for cs in (0, 1):
                idx = (hi[0] if cr else lo[0]) * stride_r
                idx = idx + (hi[1] if cc else lo[1]) * stride_c + (hi[2] if cs else lo[2])
                # + for an odd number of upper corners, - for an even one
                count += flat[idx] if (cr + cc + cs) % 2 else -flat[idx]
    return count
