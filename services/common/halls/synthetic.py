"""Synthetic halls larger than the reference, for benchmarks and simulations.

A synthetic hall tiles the reference *pod* (2 facing rows x 5 racks x 4
nodes, one hot aisle; its D is the reference D) along each aisle and across
aisles. Air leaks between neighbouring pods of the same aisle: pod p's inlets
see ``coupling`` times the reference pattern of pods p-1 and p+1. Aisles do
not exchange air. Every entry then gets seeded log-normal jitter (so that
pods are not identical and ties are rare, as in a real hall), and D is
scaled by ``1 / (1 + 2 coupling)`` so the hottest row sum stays near the
reference's 0.0087 K/W: the same thermal range, more nodes.

``sparse=True`` builds the same structure as a sparse D (each pod heats only
itself and its two neighbours: ~1 % non-zeros at 10,000 nodes), with the
jitter drawn per stored entry; halls of 10,000+ nodes need it (the dense D
alone would take 800 MB).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from services.common.thermal import Hall, HallError, reference_hall

POD_ROWS, POD_RACKS, POD_SLOTS = 2, 5, 4


def tiled_hall(
    rows: int,
    racks: int,
    seed: int = 0,
    coupling: float = 0.1,
    jitter: float = 0.1,
    sparse: bool = False,
) -> Hall:
    """A ``rows x racks x 4`` hall of reference pods (rows even, racks a multiple of 5)."""
    if rows < 2 or rows % POD_ROWS or racks < POD_RACKS or racks % POD_RACKS:
        raise HallError(
            f"synthetic hall {rows}x{racks}: rows must be a positive even number and racks a "
            f"positive multiple of {POD_RACKS}"
        )
    ref = reference_hall()
    n = rows * racks * POD_SLOTS
    d = np.zeros((0, 0) if sparse else (n, n))
    pods = racks // POD_RACKS
    local = np.array(
        [
            r * racks * POD_SLOTS + c * POD_SLOTS + s
            for r in range(POD_ROWS)
            for c in range(POD_RACKS)
            for s in range(POD_SLOTS)
        ]
    )
    members = {
        (aisle, pod): local + aisle * POD_ROWS * racks * POD_SLOTS + pod * POD_RACKS * POD_SLOTS
        for aisle in range(rows // POD_ROWS)
        for pod in range(pods)
    }
    if sparse:
        return ref.replace(
            rows=rows,
            racks=racks,
            slots=POD_SLOTS,
            d_matrix=_sparse_pods(members, pods, n, ref.d_matrix, seed, coupling, jitter),
            name=f"synthetic-{n}",
        )
    for (aisle, pod), m in members.items():
        d[np.ix_(m, m)] += ref.d_matrix
        for other in (pod - 1, pod + 1):
            if 0 <= other < pods:
                d[np.ix_(m, members[(aisle, other)])] += coupling * ref.d_matrix
    rng = np.random.default_rng(seed)
    d *= rng.lognormal(0.0, jitter, d.shape) / (1.0 + 2.0 * coupling)
    return ref.replace(rows=rows, racks=racks, slots=POD_SLOTS, d_matrix=d, name=f"synthetic-{n}")


def _sparse_pods(
    members: dict[tuple[int, int], np.ndarray],
    pods: int,
    n: int,
    pod_d: np.ndarray,
    seed: int,
    coupling: float,
    jitter: float,
) -> sp.csr_matrix:
    rows, cols, vals = [], [], []
    for (aisle, pod), m in members.items():
        for other, scale in ((pod, 1.0), (pod - 1, coupling), (pod + 1, coupling)):
            if 0 <= other < pods:
                o = members[(aisle, other)]
                rows.append(np.repeat(m, len(o)))
                cols.append(np.tile(o, len(m)))
                vals.append(scale * pod_d.ravel())
    d = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)
    )
    d.sum_duplicates()
    rng = np.random.default_rng(seed)
    d.data *= rng.lognormal(0.0, jitter, d.data.shape) / (1.0 + 2.0 * coupling)
    return d
