"""The hall's thermal model, shared by the allocator and the pusher's simulated hall.

``Tin = Tsup + D · P`` (heat recirculation), the CRAC's CoP and the cooling
power, over a :class:`Hall` layout given as data. Constants follow
the allocation model (``docs/allocator.md``); every one is a field, never a literal in code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

Float64Array = npt.NDArray[np.float64]

RHO_KG_M3 = 1.19
FLOW_M3_S = 0.2454
CP_J_KG_K = 1005.0


@dataclass(frozen=True)
class Hall:
    """A data-center hall: layout, recirculation matrix and operating constants.

    Node index ``i = row * racks * slots + rack * slots + slot`` (slot 0 at the bottom).
    """

    rows: int
    racks: int
    slots: int
    d_matrix: Float64Array
    """D[i, j]: inlet-temperature rise at node i per watt dissipated at node j (K/W)."""
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
        n = self.rows * self.racks * self.slots
        if self.d_matrix.shape != (n, n):
            raise ValueError(
                f"D must be {n}x{n} for {self.rows}x{self.racks}x{self.slots}, got {self.d_matrix.shape}"
            )
        if bool((self.d_matrix < 0).any()):
            raise ValueError("D must be non-negative")

    @property
    def n_nodes(self) -> int:
        return self.rows * self.racks * self.slots

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
        return tsup + self.d_matrix @ np.asarray(powers_w, dtype=np.float64)

    def cop(self, t_c: float) -> float:
        a, b, c = self.cop_coeffs
        return a * t_c * t_c + b * t_c + c

    def raised_supply_c(self, inlet_c: Float64Array) -> float:
        """Tsup' = Tsup + Tred - max(Tin): the slack spent on warmer supply air."""
        present = inlet_c if self.present is None else inlet_c[self.present]
        return float(self.supply_c + self.redline_c - present.max())

    def cooling_power_w(self, powers_w: npt.ArrayLike) -> float:
        """P_AC = sum(P) / CoP(Tsup')."""
        p = np.asarray(powers_w, dtype=np.float64)
        tin = self.inlet_c(p)
        return float(p.sum() / self.cop(self.raised_supply_c(tin)))

    def subset_rows(self, rows: list[int]) -> Hall:
        """The same hall with only ``rows`` present (others absent: no power, no inlet)."""
        present = np.isin(self.positions()[:, 0], rows)
        return Hall(
            self.rows,
            self.racks,
            self.slots,
            self.d_matrix,
            self.idle_power_w,
            self.busy_power_w,
            self.supply_c,
            self.redline_c,
            self.inter_row_distance,
            self.cop_coeffs,
            f"{self.name}[rows {rows}]",
            present,
        )


def d_from_a(a_matrix: npt.ArrayLike, k: npt.ArrayLike | float | None = None) -> Float64Array:
    """D = (K - Aᵀ K)^-1 - K^-1 with K = diag(ρ f c_p)."""
    a = np.asarray(a_matrix, dtype=np.float64)
    n = a.shape[0]
    kv = (
        np.full(n, RHO_KG_M3 * FLOW_M3_S * CP_J_KG_K)
        if k is None
        else np.broadcast_to(np.asarray(k, float), (n,))
    )
    kmat = np.diag(kv)
    return np.linalg.inv(kmat - a.T @ kmat) - np.diag(1.0 / kv)


def load_matrix(path: str | Path) -> Float64Array:
    """Whitespace-separated square matrix, one row per line."""
    m = np.loadtxt(path, dtype=np.float64, ndmin=2)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{path}: matrix is {m.shape[0]}x{m.shape[1]}, expected square")
    return m


def reference_hall() -> Hall:
    """The reference hall: 2 rows x 5 racks x 4 nodes, D from SST (see halls/PROVENANCE)."""
    ref = resources.files("services.common.halls").joinpath("reference-40.D.txt")
    with resources.as_file(ref) as p:
        d = load_matrix(p)
    return Hall(rows=2, racks=5, slots=4, d_matrix=d, name="reference-40")


HALL_SENSOR_PREFIX = "/hall"


def node_sensor(hall: Hall, i: int, quantity: str, prefix: str = HALL_SENSOR_PREFIX) -> str:
    """Default sensor name of a hall node's quantity: ``/hall/row0/rack3/node2/power``.

    ``quantity`` is ``power`` (W) or ``inlet_temp`` (°C). The simulated hall
    (pusher ``datacenter`` plugin) publishes these names and the allocator's
    calibration reads them unless a site maps its own sensors.
    """
    row, rack, slot = hall.position(i)
    return f"{prefix}/row{row}/rack{rack}/node{slot}/{quantity}"
