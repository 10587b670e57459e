"""Junction temperature and processor lifetime (MTTF) from inlet temperatures.

``T_HS = T_HS_ref + (Tin - Tin_ref) x``, ``Tj = T_HS + P_proc R_ja``; each
wear-out mechanism fails at ``λ = λ0 exp(-Ea / (k T))`` (T in kelvin), the
rates add, ``MTTF = 1 / λ_c``. The λ0 are calibrated so that a processor at
``calib_temp_c`` (60 °C) lives ``calib_mttf_years`` (5 years), each mechanism
contributing one third of the rate there. NBTI's effective activation energy
is its 0.15 eV divided by its time exponent 0.25, i.e. 0.6 eV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BOLTZMANN_EV_K = 8.617e-5
ZERO_C_K = 273.15

MECHANISMS: dict[str, float] = {"EM": 0.7, "TDDB": 0.75, "NBTI": 0.15 / 0.25}
"""Activation energy (eV) per mechanism: electromigration, gate-oxide breakdown, NBTI."""


@dataclass(frozen=True)
class ReliabilityModel:
    """The constants of the junction and lifetime model (all overridable)."""

    t_hs_ref_c: float = 45.0
    tin_ref_c: float = 15.0
    hs_slope: float = 0.6
    """x: heat-sink rise per kelvin of inlet rise."""
    r_ja_c_per_w: float = 0.1
    active_proc_power_w: float = 120.0
    idle_proc_power_w: float = 120.0 * 1000.0 / 3500.0
    """Default: the active power scaled by the node's idle/busy power ratio (≈ 34.3 W)."""
    calib_temp_c: float = 60.0
    calib_mttf_years: float = 5.0
    activation_ev: tuple[float, ...] = tuple(MECHANISMS.values())

    @classmethod
    def for_hall(
        cls, idle_power_w: float, busy_power_w: float, **overrides: float | None
    ) -> ReliabilityModel:
        """The model for a hall: an idle processor draws the active power scaled by the
        node's idle/busy power ratio unless ``idle_proc_power_w`` is given."""
        given = {k: v for k, v in overrides.items() if v is not None}
        active = float(given.get("active_proc_power_w", cls.active_proc_power_w) or 0.0)
        given.setdefault("idle_proc_power_w", active * idle_power_w / busy_power_w)
        return cls(**given)  # type: ignore[arg-type]

    @property
    def lambda0_per_year(self) -> npt.NDArray[np.float64]:
        """λ0 per mechanism such that each gives 1/3 of 1/MTTF at the calibration point."""
        t_k = self.calib_temp_c + ZERO_C_K
        share = 1.0 / (self.calib_mttf_years * len(self.activation_ev))
        ea = np.asarray(self.activation_ev)
        return np.asarray(share * np.exp(ea / (BOLTZMANN_EV_K * t_k)), dtype=np.float64)

    def junction_c(
        self, inlet_c: npt.ArrayLike, active: npt.ArrayLike = True
    ) -> npt.NDArray[np.float64]:
        """Tj of a processor (active or idle) behind a node with inlet ``inlet_c``."""
        tin = np.asarray(inlet_c, dtype=np.float64)
        t_hs = self.t_hs_ref_c + (tin - self.tin_ref_c) * self.hs_slope
        p = np.where(
            np.asarray(active, dtype=bool), self.active_proc_power_w, self.idle_proc_power_w
        )
        return np.asarray(t_hs + p * self.r_ja_c_per_w, dtype=np.float64)

    def failure_rate_per_year(self, junction_c: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """λ_c = Σ_mechanisms λ0 exp(-Ea / (k T)) for each junction temperature."""
        t_k = np.asarray(junction_c, dtype=np.float64)[..., None] + ZERO_C_K
        ea = np.asarray(self.activation_ev)
        rates = self.lambda0_per_year * np.exp(-ea / (BOLTZMANN_EV_K * t_k))
        return np.asarray(rates.sum(axis=-1), dtype=np.float64)

    def mttf_years(self, junction_c: npt.ArrayLike) -> npt.NDArray[np.float64]:
        return np.asarray(1.0 / self.failure_rate_per_year(junction_c), dtype=np.float64)

    def reliability(self, years: float, junction_c: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """R(t) = exp(-λ_c t): probability a processor survives ``years``."""
        return np.asarray(np.exp(-self.failure_rate_per_year(junction_c) * years))

    def min_mttf_years(self, inlet_c: npt.ArrayLike, active: npt.ArrayLike) -> float:
        """The shortest processor MTTF in the hall (the hottest junction decides)."""
        tj = self.junction_c(inlet_c, active)
        return float(self.mttf_years(float(np.max(tj))))
