"""The simulated hall's dynamics: thermal mass and a CRAC that controls its supply air.

:mod:`services.common.thermal` is the steady state (``Tin = Tsup + D·P``);
a real hall gets there with a lag and a controller in between:

* **Thermal mass.** What a node hands to the air (its heat output ``Q``)
  follows its electrical power ``P`` with a first-order lag of time constant
  ``time_constant_s`` (the heat sinks, chassis and the node's air volume warm
  up first): ``dQ/dt = (P - Q) / τ``. Inlets see the recirculated heat,
  ``Tin = Tsup + D·Q``; outlets add a node's own, ``Tout = Tin + Q / K``.
* **Cooling.** The CRAC removes the heat the air carries back, ``ΣQ``, with
  the coefficient of performance at its supply temperature:
  ``P_AC = ΣQ / CoP(Tsup)``.
* **Supply control.** The CRAC raises its supply while the hottest inlet is
  below ``redline - margin`` and lowers it when above (supply-air reset on
  rack-inlet sensors), moving at most ``supply_rate_c_per_s`` and staying in
  ``[supply_min_c, supply_max_c]``. A fast rise in load can outrun it, and at
  its lowest supply it cannot keep the redline: that is when a hall crosses.

Both the heat and the supply change smoothly, so the cooling power does too:
:meth:`HallPhysics.step` advances the state by one sample with the exact
discretisation of the lag for a power held over the step (what
:func:`lagged` undoes for calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.common.thermal import K_DEFAULT_W_K, Float64Array, Hall, HallError


@dataclass(frozen=True)
class Physics:
    """The constants of the simulated hall's dynamics (see the module docstring)."""

    time_constant_s: float = 20.0
    """τ of the first-order lag from a node's electrical power to its heat output (s); 0 = none."""
    supply_min_c: float = 12.0
    """Lowest supply the CRAC can deliver (°C)."""
    supply_max_c: float = 24.0
    """Highest supply the CRAC is allowed (°C)."""
    supply_rate_c_per_s: float = 0.05
    """Fastest change of the supply temperature (°C/s; 3 °C a minute)."""
    margin_c: float = 2.5
    """The controller aims the hottest inlet at ``redline - margin``."""
    gain_per_s: float = 0.2
    """How fast the supply closes the gap to its target, before the rate limit (1/s)."""

    def __post_init__(self) -> None:
        if not self.time_constant_s >= 0:
            raise HallError(f"time_constant_s must be >= 0, got {self.time_constant_s}")
        if not self.supply_min_c <= self.supply_max_c:
            raise HallError(
                f"supply_min_c ({self.supply_min_c}) must not exceed supply_max_c "
                f"({self.supply_max_c})"
            )
        if not self.supply_rate_c_per_s > 0 or not self.gain_per_s > 0:
            raise HallError("supply_rate_c_per_s and gain_per_s must be positive")
        if not self.margin_c >= 0:
            raise HallError(f"margin_c must be >= 0, got {self.margin_c}")


@dataclass(frozen=True)
class HallReading:
    """The true state of the hall at one instant (before any sensor noise)."""

    power_w: Float64Array
    """Electrical power per node (W), as given."""
    heat_w: Float64Array
    """Heat each node hands to the air (W): its power, lagged."""
    inlet_c: Float64Array
    outlet_c: Float64Array
    supply_c: float
    cooling_w: float


def lag_factor(dt_s: float, time_constant_s: float) -> float:
    """The share of the gap ``P - Q`` a first-order lag closes over ``dt_s``."""
    if time_constant_s <= 0:
        return 1.0
    return -math.expm1(-max(dt_s, 0.0) / time_constant_s)


class HallPhysics:
    """The hall's state (heat per node, supply temperature), advanced sample by sample."""

    def __init__(self, hall: Hall, physics: Physics | None = None) -> None:
        self.hall = hall
        self.physics = physics or Physics()
        p = self.physics
        self.supply_c = float(min(max(hall.supply_c, p.supply_min_c), p.supply_max_c))
        self.heat_w: Float64Array | None = None
        self.last_s: float | None = None
        self.k_w_per_k = K_DEFAULT_W_K
        self._present = hall.present_mask

    def step(self, now_s: float, power_w: npt.ArrayLike) -> HallReading:
        """The hall at ``now_s`` after drawing ``power_w`` since the previous step.

        The first step starts from steady state at that power (a hall that has
        run like this for a while); a step back in time only re-reads the state.
        """
        p = self.physics
        power = np.asarray(power_w, dtype=np.float64)
        dt = 0.0 if self.last_s is None else max(now_s - self.last_s, 0.0)
        if self.heat_w is None:
            self.heat_w = power.copy()
        else:
            self.heat_w = self.heat_w + lag_factor(dt, p.time_constant_s) * (power - self.heat_w)
        if self.last_s is None or now_s > self.last_s:
            self.last_s = now_s
        heat = self.heat_w
        hall = self.hall
        rise = np.asarray(hall.d_matrix @ heat, dtype=np.float64)
        hottest = float(rise[self._present].max())
        if dt > 0:
            target = min(max(hall.redline_c - p.margin_c - hottest, p.supply_min_c), p.supply_max_c)
            gap = target - self.supply_c
            move = gap * -math.expm1(-p.gain_per_s * dt)
            limit = p.supply_rate_c_per_s * dt
            self.supply_c += min(max(move, -limit), limit)
        inlet = self.supply_c + rise
        outlet = inlet + heat / self.k_w_per_k
        cooling = float(heat.sum() / hall.cop(self.supply_c))
        return HallReading(power, heat.copy(), inlet, outlet, self.supply_c, cooling)


def lagged(times_ns: npt.ArrayLike, power_w: npt.ArrayLike, time_constant_s: float) -> Float64Array:
    """``power_w[t, j]`` sampled at ``times_ns[t]`` through the lag :class:`HallPhysics` applies.

    Starts from the first sample (steady state there), each sample held until
    the next, exactly as the simulated hall integrates its sampled power.
    """
    p = np.asarray(power_w, dtype=np.float64)
    if time_constant_s <= 0 or len(p) == 0:
        return p.copy()
    dt = np.diff(np.asarray(times_ns, dtype=np.int64)) / 1e9
    alpha = -np.expm1(-np.maximum(dt, 0.0) / time_constant_s)
    out = np.empty_like(p)
    out[0] = p[0]
    for t in range(1, len(p)):
        out[t] = out[t - 1] + alpha[t - 1] * (p[t] - out[t - 1])
    return out


__all__ = ["HallPhysics", "HallReading", "Physics", "lag_factor", "lagged"]
