"""The hall's thermal model, shared by the allocator and the pusher's simulated hall.

``Tin = Tsup + D · P`` (heat recirculation), the CRAC's CoP and the cooling
power, over a :class:`Hall` layout given as data (``halls/`` holds the
reference hall; :mod:`services.common.halls.hallfile` reads and writes hall
files). Constants follow the allocation model (``docs/allocator.md``); every
one is a field, never a literal in code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from services.common.errors import ConfigError

Float64Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

RHO_KG_M3 = 1.19
"""Air density."""
FLOW_M3_S = 0.2454
"""Air flow through one node."""
CP_J_KG_K = 1005.0
"""Specific heat of air."""
K_DEFAULT_W_K = RHO_KG_M3 * FLOW_M3_S * CP_J_KG_K
"""K_i = ρ f_i c_p: heat a node's air stream carries per kelvin (≈ 293.5 W/K)."""


class HallError(ConfigError, ValueError):
    """A hall description (layout, matrix, constants) is inconsistent."""


@dataclass(frozen=True, eq=False)
class Hall:
    """A data-center hall: layout, recirculation matrix and operating constants.

    Node index ``i = row * racks * slots + rack * slots + slot`` (slot 0 at the bottom).
    """

    rows: int
    racks: int
    slots: int
    d_matrix: Float64Array
    """D[i, j]: inlet-temperature rise at node i per watt dissipated at node j (K/W).

    Dense, or a ``scipy.sparse`` matrix (kept as CSR) for large halls: heat
    recirculation is local, so a 10,000-node hall's D has ~1 % non-zeros."""
    idle_power_w: float = 1000.0
    busy_power_w: float = 3500.0
    supply_c: float = 15.0
    redline_c: float = 30.0
    inter_row_distance: float = 10.0
    cop_coeffs: tuple[float, float, float] = (0.0068, 0.0008, 0.458)
    """CoP(T) = a T^2 + b T + c, T in °C."""
    name: str = "hall"
    present: npt.NDArray[np.bool_] | None = field(default=None)
    """Nodes that exist and draw power (None = all)."""

    def __post_init__(self) -> None:
        for what in ("rows", "racks", "slots"):
            v = getattr(self, what)
            if not isinstance(v, int | np.integer) or v < 1:
                raise HallError(f"hall {self.name!r}: {what} must be a positive integer, got {v!r}")
        n = self.rows * self.racks * self.slots
        if sp.issparse(self.d_matrix):
            d: Any = sp.csr_matrix(self.d_matrix, dtype=np.float64)
            d.sum_duplicates()
            values = d.data
        else:
            d = np.asarray(self.d_matrix, dtype=np.float64)
            values = d
        object.__setattr__(self, "d_matrix", d)
        if d.shape != (n, n):
            raise HallError(
                f"hall {self.name!r}: D must be {n}x{n} for {self.rows}x{self.racks}x{self.slots}, "
                f"got {'x'.join(map(str, d.shape))}"
            )
        if not bool(np.isfinite(values).all()):
            raise HallError(f"hall {self.name!r}: D has non-finite entries")
        if bool((values < 0).any()):
            i, j = np.argwhere(d < 0)[0] if not sp.issparse(d) else sp.find(d < 0)[:2]
            i, j = int(np.ravel(i)[0]), int(np.ravel(j)[0])
            raise HallError(f"hall {self.name!r}: D must be non-negative; D[{i}, {j}] = {d[i, j]}")
        for what in ("idle_power_w", "busy_power_w", "supply_c", "redline_c", "inter_row_distance"):
            if not np.isfinite(getattr(self, what)):
                raise HallError(
                    f"hall {self.name!r}: {what} must be finite, got {getattr(self, what)}"
                )
        if not bool(np.isfinite(self.cop_coeffs).all()):
            raise HallError(f"hall {self.name!r}: cop_coeffs must be finite, got {self.cop_coeffs}")
        if not self.redline_c > self.supply_c:
            raise HallError(
                f"hall {self.name!r}: redline_c ({self.redline_c}) must exceed supply_c "
                f"({self.supply_c})"
            )
        if not 0 <= self.idle_power_w <= self.busy_power_w:
            raise HallError(
                f"hall {self.name!r}: expected 0 <= idle_power_w ({self.idle_power_w}) <= "
                f"busy_power_w ({self.busy_power_w})"
            )
        if self.inter_row_distance < 0:
            raise HallError(f"hall {self.name!r}: inter_row_distance must be >= 0")
        a, b, c = self.cop_coeffs
        # Tsup' can be any temperature (below zero in a hot hall): CoP must stay positive.
        if not (a > 0 and c - b * b / (4 * a) > 0) and not (a == b == 0 < c):
            raise HallError(
                f"hall {self.name!r}: cop_coeffs {list(self.cop_coeffs)}: CoP(T) = aT² + bT + c "
                "must be positive at every T (a > 0 with c > b²/4a, or a = b = 0 < c)"
            )
        if self.present is not None:
            p = np.asarray(self.present, dtype=bool)
            if p.shape != (n,):
                raise HallError(f"hall {self.name!r}: present mask must have {n} entries")
            if not p.any():
                raise HallError(f"hall {self.name!r}: no node is present")
            object.__setattr__(self, "present", p)

    @property
    def sparse(self) -> bool:
        """Whether D is held sparse (large halls)."""
        return bool(sp.issparse(self.d_matrix))

    @property
    def n_nodes(self) -> int:
        return self.rows * self.racks * self.slots

    @property
    def present_mask(self) -> BoolArray:
        """Boolean mask of present nodes (all True when ``present`` is None)."""
        if self.present is None:
            return np.ones(self.n_nodes, dtype=bool)
        return self.present

    def position(self, i: int) -> tuple[int, int, int]:
        """Node index -> (row, rack, slot)."""
        per_row = self.racks * self.slots
        return i // per_row, (i % per_row) // self.slots, i % self.slots

    def index(self, row: int, rack: int, slot: int) -> int:
        return row * self.racks * self.slots + rack * self.slots + slot

    def positions(self) -> npt.NDArray[np.int64]:
        """(n, 3) array of (row, rack, slot)."""
        i = np.arange(self.n_nodes)
        per_row = self.racks * self.slots
        return np.stack([i // per_row, (i % per_row) // self.slots, i % self.slots], axis=1)

    def powers_w(self, busy: npt.ArrayLike) -> Float64Array:
        """Node powers for a busy mask (or a per-node utilisation in [0, 1])."""
        x = np.asarray(busy, dtype=np.float64)
        p = self.idle_power_w + x * (self.busy_power_w - self.idle_power_w)
        if self.present is not None:
            p = np.where(self.present, p, 0.0)
        return p

    def inlet_c(self, powers_w: npt.ArrayLike, supply_c: float | None = None) -> Float64Array:
        """Tin = Tsup + D · P."""
        tsup = self.supply_c if supply_c is None else supply_c
        return np.asarray(tsup + self.d_matrix @ np.asarray(powers_w, dtype=np.float64))

    def max_inlet_c(self, inlet_c: Float64Array) -> float:
        """The hottest inlet among present nodes."""
        present = inlet_c if self.present is None else inlet_c[self.present]
        return float(present.max())

    def cop(self, t_c: float) -> float:
        a, b, c = self.cop_coeffs
        return a * t_c * t_c + b * t_c + c

    def raised_supply_c(self, inlet_c: Float64Array) -> float:
        """Tsup' = Tsup + Tred - max(Tin): the slack spent on warmer supply air."""
        return float(self.supply_c + self.redline_c - self.max_inlet_c(inlet_c))

    def cooling_power_w(self, powers_w: npt.ArrayLike) -> float:
        """P_AC = sum(P) / CoP(Tsup')."""
        p = np.asarray(powers_w, dtype=np.float64)
        tin = self.inlet_c(p)
        return float(p.sum() / self.cop(self.raised_supply_c(tin)))

    def replace(self, **changes: object) -> Hall:
        """A copy with some fields changed (e.g. a fitted ``d_matrix``); validated again."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def subset_rows(self, rows: list[int]) -> Hall:
        """The same hall with only ``rows`` present (others absent: no power, no inlet)."""
        present = np.isin(self.positions()[:, 0], rows)
        return self.replace(present=present, name=f"{self.name}[rows {rows}]")


def d_from_a(a_matrix: npt.ArrayLike, k: npt.ArrayLike | float | None = None) -> Float64Array:
    """D = (K - Aᵀ K)^-1 - K^-1 with K = diag(K_i), K_i = ρ f_i c_p (W/K).

    ``a_matrix[i, j]`` is the fraction of node i's outlet heat reaching node
    j's inlet; ``k`` is one K for all nodes or one per node (default ρ f c_p).
    """
    a = np.asarray(a_matrix, dtype=np.float64)
    kv = _k_vector(a.shape[0], k)
    kmat = np.diag(kv)
    return np.asarray(np.linalg.inv(kmat - a.T @ kmat) - np.diag(1.0 / kv), dtype=np.float64)


def a_from_d(d_matrix: npt.ArrayLike, k: npt.ArrayLike | float | None = None) -> Float64Array:
    """The inverse of :func:`d_from_a`: ``A = (I - (D + K^-1)^-1 K^-1)ᵀ``.

    From ``D + K^-1 = (K - Aᵀ K)^-1``: ``Aᵀ K = K - (D + K^-1)^-1``. A D that
    did not come from a physical A (e.g. one fitted from noisy data) can give
    small negative fractions; they are returned as computed, not clipped.
    """
    d = np.asarray(d_matrix, dtype=np.float64)
    kv = _k_vector(d.shape[0], k)
    m = np.linalg.inv(d + np.diag(1.0 / kv))
    at = np.eye(d.shape[0]) - m / kv[None, :]
    return np.asarray(at.T, dtype=np.float64)


def _k_vector(n: int, k: npt.ArrayLike | float | None) -> Float64Array:
    if k is None:
        return np.full(n, K_DEFAULT_W_K)
    kv = np.broadcast_to(np.asarray(k, dtype=np.float64), (n,)).copy()
    if not bool((kv > 0).all()):
        raise HallError("K (ρ f c_p per node, W/K) must be positive")
    return kv


def load_matrix(path: str | Path) -> Float64Array:
    """A square matrix: whitespace-separated text (one row per line), ``.npy``, or a sparse
    ``.npz`` (``scipy.sparse.save_npz``, for large halls)."""
    p = Path(path)
    try:
        if p.suffix == ".npz":
            sparse = sp.load_npz(p)
            if sparse.ndim != 2 or sparse.shape[0] != sparse.shape[1]:
                raise HallError(
                    f"{p}: matrix is {'x'.join(map(str, sparse.shape))}, expected square"
                )
            return sparse.tocsr()  # type: ignore[no-any-return]
        m = (
            np.load(p, allow_pickle=False)
            if p.suffix == ".npy"
            else np.loadtxt(p, dtype=np.float64, ndmin=2)
        )
    except (OSError, ValueError) as exc:
        raise HallError(f"{p}: cannot read matrix: {exc}") from exc
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise HallError(f"{p}: matrix is {'x'.join(map(str, m.shape))}, expected square")
    return m


def reference_hall() -> Hall:
    """The reference hall: 2 rows x 5 racks x 4 nodes, D from SST (see halls/PROVENANCE)."""
    from services.common.halls.hallfile import load_reference

    return load_reference()


HALL_SENSOR_PREFIX = "/hall"


def node_sensor(hall: Hall, i: int, quantity: str, prefix: str = HALL_SENSOR_PREFIX) -> str:
    """Default sensor name of a hall node's quantity: ``/hall/row0/rack3/node2/power``.

    ``quantity`` is ``power`` (W) or ``inlet_temp`` (°C). The simulated hall
    (pusher ``datacenter`` plugin) publishes these names and the allocator's
    calibration reads them unless a site maps its own sensors.
    """
    row, rack, slot = hall.position(i)
    return f"{prefix}/row{row}/rack{rack}/node{slot}/{quantity}"
