"""The allocator's view of a hall: thermal, power, communication and reliability models together.

:class:`HallModel` wraps a :class:`~services.common.thermal.Hall` with what
placement needs over and over (positions, the MC1x1 shell matrix, the
``CC_min`` table, a sparse D) computed once, and :meth:`HallModel.assess`
turns a vector of node powers into the numbers every decision reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from services.allocator.ccmin import CCMinTable, cc_min_table
from services.allocator.communication import (
    axis_weights,
    communication_cost,
    communication_fraction,
    latency_factor,
)
from services.allocator.reliability import ReliabilityModel
from services.common.thermal import Float64Array, Hall

IntArray = npt.NDArray[np.int64]

__all__ = ["Float64Array", "HallModel", "IntArray", "PowerModel", "Thermal"]


@dataclass(frozen=True)
class PowerModel:
    """Node power of a busy node; phase-weighted by its job's communication share."""

    compute_w: float = 3500.0
    comm_w: float = 2700.0
    phase_weighted: bool = True
    """False: every busy node draws ``compute_w`` (the static experiments)."""

    def busy_w(self, comm_share: float, lf: float = 1.0) -> float:
        if not self.phase_weighted or comm_share <= 0.0:
            return self.compute_w
        c = communication_fraction(comm_share, lf)
        return (1.0 - c) * self.compute_w + c * self.comm_w


@dataclass(frozen=True)
class Thermal:
    """The hall-wide consequences of a power vector."""

    max_tin_c: float
    supply_c: float
    """The raised supply temperature Tsup' = Tsup + Tred - max Tin."""
    cop: float
    computing_kw: float
    cooling_kw: float
    min_mttf_years: float
    base_supply_c: float
    """The CRAC supply the inlet temperatures (``inlet_c``, ``max_tin_c``) are computed at."""
    inlet_c: Float64Array = field(repr=False)

    def totals(self) -> dict[str, float]:
        """The hall-wide numbers by their reported names (a decision's: ``supply_c`` is Tsup')."""
        return {
            "max_tin_c": self.max_tin_c,
            "supply_c": self.supply_c,
            "cop": self.cop,
            "computing_kw": self.computing_kw,
            "cooling_kw": self.cooling_kw,
            "min_mttf_years": self.min_mttf_years,
        }

    def hall_totals(self) -> dict[str, float]:
        """The totals of ``GET /api/v1/hall``, next to every node's ``predicted_tin_c``.

        ``supply_c`` is Tsup' = Tsup + Tred - max Tin, the raised supply the
        slack to the redline allows, at which ``cop`` and ``cooling_kw`` are
        computed, as in every decision; ``base_supply_c`` is the CRAC supply the
        inlets (and ``max_tin_c``) are computed at (``supply_c`` is below it
        when the peak inlet is above the redline).
        """
        return {**self.totals(), "base_supply_c": self.base_supply_c}


class HallModel:
    """A hall plus the derived data placement needs (immutable; swap it to change D)."""

    def __init__(
        self,
        hall: Hall,
        reliability: ReliabilityModel | None = None,
        power: PowerModel | None = None,
    ) -> None:
        self.hall = hall
        self.n = hall.n_nodes
        self.present = hall.present_mask
        self.pos: IntArray = hall.positions()
        self.weights = axis_weights(hall.inter_row_distance)
        self.reliability = reliability or ReliabilityModel.for_hall(
            hall.idle_power_w, hall.busy_power_w
        )
        self.power = power or PowerModel(compute_w=hall.busy_power_w)
        self._scratch: tuple[Float64Array, Float64Array] | None = None
        self._scratch_owner: object = None

    def with_hall(self, hall: Hall) -> HallModel:
        """The same models over another hall (e.g. a fitted D)."""
        return HallModel(hall, self.reliability, self.power)

    @cached_property
    def d_csc(self) -> sp.csc_matrix:
        """D with the rows of absent nodes zeroed (their inlet does not count), by column."""
        d = sp.csr_matrix(self.hall.d_matrix)
        if self.hall.present is not None:
            d = sp.diags(self.present.astype(np.float64)) @ d
        d = sp.csc_matrix(d)
        d.sum_duplicates()  # canonical: rows sorted within each column, each once
        return d

    @cached_property
    def entry_cols(self) -> npt.NDArray[np.int32]:
        """The column of every stored entry of :attr:`d_csc`, in storage order."""
        counts = np.diff(self.d_csc.indptr)
        return np.repeat(np.arange(self.n, dtype=np.int32), counts)

    @cached_property
    def nonempty_cols(self) -> tuple[IntArray, IntArray]:
        """(the columns of :attr:`d_csc` with entries, where each one's entries start)."""
        indptr = self.d_csc.indptr
        cols = np.flatnonzero(np.diff(indptr)).astype(np.int64)
        return cols, indptr[cols].astype(np.int64)

    def scratch(self, owner: object) -> tuple[Float64Array, Float64Array]:
        """Two arrays the size of D's entries, lent to ``owner`` until the next call.

        One decision's per-entry arrays (a hall of 10,000 nodes: 2 x 9 MB), reused
        rather than allocated afresh: on a loaded machine faulting in fresh pages cost
        more than the arithmetic. Decisions run one at a time; :meth:`lent_to` lets a
        holder check that its arrays are still its own.
        """
        if self._scratch is None:
            size = self.d_csc.nnz
            self._scratch = (np.empty(size), np.empty(size))
        self._scratch_owner = owner
        return self._scratch

    def lent_to(self, owner: object) -> bool:
        return self._scratch_owner is owner

    @cached_property
    def col_sums(self) -> Float64Array:
        """Σ_i D_ij over present rows for every node j (bit for bit what summing its column
        of ``d_csc`` alone gives: the same entries, in the same order)."""
        return np.asarray(self.d_csc.sum(axis=0), dtype=np.float64).ravel()

    def inlet_rise(self, nodes: IntArray, rise: Float64Array) -> Float64Array:
        """``d_csc[:, nodes] @ rise[nodes]``: what the nodes' power rise adds to every inlet.

        For ascending, distinct ``nodes`` each row's sum runs over their columns in
        index order; so does the whole D times the rise set to 0 elsewhere (adding
        0.0 changes no sum), which for many nodes is cheaper than copying their columns.
        """
        d = self.d_csc
        if 5 * len(nodes) < 2 * self.n or not bool(np.all(np.diff(nodes) > 0)):  # crossover ~40 %
            return np.asarray(d[:, nodes] @ rise[nodes], dtype=np.float64)
        masked = np.zeros(self.n)
        masked[nodes] = rise[nodes]
        return np.asarray(d @ masked, dtype=np.float64)

    @cached_property
    def d_csr(self) -> sp.csr_matrix:
        """All of D, sparse: recirculation is local, so Tin costs O(nnz) not O(N²)."""
        return sp.csr_matrix(self.hall.d_matrix)

    def inlet_c(self, powers_w: Float64Array) -> Float64Array:
        """Tin = Tsup + D · P (every node, present or not)."""
        return np.asarray(self.hall.supply_c + self.d_csr @ powers_w, dtype=np.float64)

    def shell_dist(self, a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """MC1x1 shell index between nodes ``a`` (rows) and ``b`` (columns):
        max(|Δrack|, |Δslot|, ceil(d_row |Δrow|)); computed when asked, O(|a| |b|)."""
        pa = self.pos[np.atleast_1d(np.asarray(a, dtype=np.int64))]
        pb = self.pos[np.asarray(b, dtype=np.int64)]
        d_row = np.ceil(self.hall.inter_row_distance * np.abs(pa[:, None, 0] - pb[None, :, 0]))
        d_rack = np.abs(pa[:, None, 1] - pb[None, :, 1])
        d_slot = np.abs(pa[:, None, 2] - pb[None, :, 2])
        out: npt.NDArray[np.int32] = np.maximum(np.maximum(d_rack, d_slot), d_row).astype(np.int32)
        return out

    @property
    def shells(self) -> npt.NDArray[np.int32]:
        """The whole shell matrix (N x N: small halls and tests only)."""
        everything = np.arange(self.n)
        return self.shell_dist(everything, everything)

    @cached_property
    def cc_min(self) -> CCMinTable:
        """Exact when the present nodes form a full box; else the whole hall's (a lower bound)."""
        p = self.pos[self.present]
        spans = [np.unique(p[:, a]) for a in range(3)]
        box = all(len(s) == s[-1] - s[0] + 1 for s in spans) and p.shape[0] == int(
            np.prod([len(s) for s in spans])
        )
        if box:
            shape = (len(spans[0]), len(spans[1]), len(spans[2]))
            return cc_min_table(shape, self.weights)
        table = cc_min_table((self.hall.rows, self.hall.racks, self.hall.slots), self.weights)
        return CCMinTable(table.values, np.zeros_like(table.exact), table.method + " (lower bound)")

    def cc(self, nodes: npt.ArrayLike) -> float:
        return communication_cost(self.pos[np.asarray(nodes, dtype=np.int64)], self.weights)

    def lf(self, nodes: npt.ArrayLike, cc: float | None = None) -> float:
        idx = np.asarray(nodes, dtype=np.int64)
        value = self.cc(idx) if cc is None else cc
        n = len(idx)
        return 1.0 if n < 2 else latency_factor(value, float(self.cc_min.values[n]))

    def assess(self, powers_w: Float64Array, busy: npt.NDArray[np.bool_]) -> Thermal:
        """Tin, raised supply, CoP, computing and cooling power, shortest MTTF."""
        hall = self.hall
        tin = self.inlet_c(powers_w)
        max_tin = hall.max_inlet_c(tin)
        supply = hall.supply_c + hall.redline_c - max_tin
        cop = hall.cop(supply)
        computing_w = float(powers_w[self.present].sum())
        present_tin = tin[self.present]
        mttf = self.reliability.min_mttf_years(present_tin, busy[self.present])
        return Thermal(
            max_tin_c=max_tin,
            supply_c=supply,
            cop=cop,
            computing_kw=computing_w / 1e3,
            cooling_kw=computing_w / cop / 1e3,
            min_mttf_years=mttf,
            base_supply_c=hall.supply_c,
            inlet_c=tin,
        )
