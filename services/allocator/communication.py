"""Communication cost: node distances, a job's CC, the exact ``CC_min(n)`` and the latency factor.

``dist(s, t) = |Δrack| + |Δslot| + inter_row_distance * |Δrow|`` and
``CC = (1/n) Σ_{s≠t} dist(s, t)`` over ordered pairs. Because the distance is
a weighted L1 norm, the pair sum splits into one term per axis, and each term
depends only on how many nodes sit at each coordinate of that axis:
``Σ_{s<t} |x_s - x_t| = Σ_g L_g (n - L_g)`` where ``L_g`` counts the nodes
left of the boundary g. :mod:`.ccmin` uses that to find ``CC_min`` exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Float64Array = npt.NDArray[np.float64]


def axis_weights(inter_row_distance: float) -> Float64Array:
    """Hop weight of one step along (row, rack, slot)."""
    return np.array([inter_row_distance, 1.0, 1.0])


def pair_sum(positions: npt.NDArray[np.int64], weights: Float64Array) -> float:
    """Σ over unordered pairs of the weighted L1 distance, O(n log n) per axis."""
    n = positions.shape[0]
    if n < 2:
        return 0.0
    x = np.sort(positions, axis=0).astype(np.float64)
    # Σ_{i<j} (x_j - x_i) for sorted x = Σ_k x_k (2k - n + 1)
    coef = 2.0 * np.arange(n) - n + 1.0
    return float(weights @ (coef @ x))


def communication_cost(positions: npt.NDArray[np.int64], weights: Float64Array) -> float:
    """CC = (1/n) Σ over ordered pairs s≠t of dist(s, t); 0 for a one-node job."""
    n = positions.shape[0]
    return 0.0 if n < 2 else 2.0 * pair_sum(positions, weights) / n


def distance_matrix(
    a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], weights: Float64Array
) -> Float64Array:
    """dist between every node of ``a`` (rows) and of ``b`` (columns)."""
    # one axis at a time: no |a| x |b| x 3 intermediate
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    if np.array_equal(weights, np.round(weights)) and np.abs(weights).max() < 2**15:
        # integer weights: the whole sum in int32, exact like every float sum of it
        whole = weights.astype(np.int32)
        out = np.zeros((a.shape[0], b.shape[0]), dtype=np.int32)
        for axis in range(a.shape[1]):
            step = np.abs(a32[:, None, axis] - b32[None, :, axis])
            out += step if whole[axis] == 1 else whole[axis] * step
        return out.astype(np.float64)
    total = np.zeros((a.shape[0], b.shape[0]))
    for axis in range(a.shape[1]):  # integers times the weights, added in axis order
        total += weights[axis] * np.abs(a32[:, None, axis] - b32[None, :, axis])
    return total


def distance_sums(
    points: npt.NDArray[np.int64], others: npt.NDArray[np.int64], weights: Float64Array
) -> Float64Array:
    """Σ over ``others`` of dist(p, o) for every point p, in O((n + m) log m) per axis."""
    total = np.zeros(points.shape[0])
    m = others.shape[0]
    for axis in range(points.shape[1]):
        v = np.sort(others[:, axis]).astype(np.float64)
        prefix = np.r_[0.0, np.cumsum(v)]
        x = points[:, axis].astype(np.float64)
        k = np.searchsorted(v, x, side="right")
        below = x * k - prefix[k]
        above = (prefix[m] - prefix[k]) - x * (m - k)
        total += weights[axis] * (below + above)
    return total


def latency_factor(cc: float, cc_min: float) -> float:
    """Lf = CC / CC_min (1 for one-node jobs, never below 1)."""
    if cc_min <= 0.0:
        return 1.0
    return max(1.0, cc / cc_min)


def runtime_stretch(comm_share: float, lf: float) -> float:
    """runtime / base_runtime = (1 - C) + C * Lf."""
    return (1.0 - comm_share) + comm_share * lf


def communication_fraction(comm_share: float, lf: float) -> float:
    """c_eff = C Lf / ((1 - C) + C Lf): the communicating share of the stretched runtime."""
    return comm_share * lf / runtime_stretch(comm_share, lf)
