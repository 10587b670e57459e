"""What each node of the simulated hall draws from moment to moment: job phases and jitter.

The allocator reports a busy node's *average* power, the time-weighted mix of
its job's phases (``docs/allocator.md``, spec section 3): 3500 W while
computing, 2700 W while communicating, the communication share ``c`` of the
stretched runtime. A real node does not draw that average; it alternates. Here
every busy node alternates compute and communication phases whose lengths are
exponential with means ``(1 - c) * period`` and ``c * period``, so the time
average is exactly the allocator's figure, and on top of the phase level every
node's utilisation jitters (load imbalance, OS noise, fans): Gaussian, a
fraction of the node's dynamic range ``busy - idle``, drawn per sample.

``phases="node"`` (default): each node keeps its own phase clock — load
imbalance and OS noise put a job's nodes into their communication phases at
different moments. ``"job"``: a job's nodes switch in lock-step (a strictly
bulk-synchronous code). ``"off"``: busy nodes draw the average.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from services.common.readings import Float64Array

PhaseMode = Literal["node", "job", "off"]

COMM_POWER_W = 2700.0
"""A busy node's power while communicating (allocation model, section 3)."""


@dataclass(frozen=True)
class LoadSettings:
    compute_w: float
    """Power while computing (the hall's busy power)."""
    comm_w: float
    idle_w: float
    phases: PhaseMode = "node"
    phase_period_s: float = 2.0
    """Mean length of one compute + communication cycle."""
    busy_jitter: float = 0.05
    """Standard deviation of a busy node's utilisation, as a fraction of ``compute_w - idle_w``."""
    idle_jitter: float = 0.02
    """The same for an idle node."""

    def comm_fraction(self, average_w: float) -> float:
        """The communication share ``c`` a busy node's average power implies."""
        span = self.compute_w - self.comm_w
        if span <= 0:
            return 0.0
        return min(max((self.compute_w - average_w) / span, 0.0), 1.0)


class _Phase:
    """One alternating compute/communication clock."""

    __slots__ = ("comm", "share", "until_s")

    def __init__(self, share: float, now_s: float, rng: np.random.Generator, period_s: float):
        self.share = share
        self.comm = False
        self.until_s = 0.0
        self.restart(now_s, rng, period_s)

    def restart(self, now_s: float, rng: np.random.Generator, period_s: float) -> None:
        """Enter a phase with its long-run odds (exponential lengths have no memory)."""
        self.comm = bool(rng.random() < self.share)
        self.until_s = now_s + self._length(rng, period_s)

    def _length(self, rng: np.random.Generator, period_s: float) -> float:
        if not 0.0 < self.share < 1.0:  # only one kind of phase: it never ends
            return math.inf
        mean = (self.share if self.comm else 1.0 - self.share) * period_s
        return float(rng.exponential(mean))

    def at(self, now_s: float, rng: np.random.Generator, period_s: float) -> bool:
        """In a communication phase at ``now_s``? (Time only moves forward.)"""
        if now_s - self.until_s > 20 * period_s:  # after a long pause: afresh, not a long loop
            self.restart(now_s, rng, period_s)
        while self.until_s <= now_s:
            self.comm = not self.comm
            self.until_s += self._length(rng, period_s)
        return self.comm


class NodeLoad:
    """Instantaneous node powers around the allocator's averages."""

    def __init__(self, settings: LoadSettings, rng: np.random.Generator) -> None:
        self.s = settings
        self.rng = rng
        self._phases: dict[tuple[str, int], _Phase] = {}

    def powers_w(
        self,
        now_s: float,
        average_w: Float64Array,
        busy: npt.NDArray[np.bool_],
        jobs: Sequence[str | None],
    ) -> Float64Array:
        """One sample of every node's power (W); absent nodes (average 0) stay at 0."""
        s = self.s
        power = np.array(average_w, dtype=np.float64)
        if s.phases != "off":
            live: set[tuple[str, int]] = set()
            for i in np.flatnonzero(busy).tolist():
                key = (jobs[i] or f"node{i}", i if s.phases == "node" else -1)
                live.add(key)
                phase = self._phases.get(key)
                share = s.comm_fraction(float(average_w[i]))
                if phase is None or phase.share != share:
                    phase = self._phases[key] = _Phase(share, now_s, self.rng, s.phase_period_s)
                comm = phase.at(now_s, self.rng, s.phase_period_s)
                power[i] = s.comm_w if comm else s.compute_w
            for key in self._phases.keys() - live:  # finished jobs
                del self._phases[key]
        span = max(s.compute_w - s.idle_w, 0.0)
        sigma = np.where(busy, s.busy_jitter, s.idle_jitter) * span
        if span > 0 and (s.busy_jitter or s.idle_jitter):
            power += self.rng.normal(0.0, 1.0, power.shape) * sigma
        return np.where(np.asarray(average_w) > 0, np.maximum(power, 0.0), 0.0)


__all__ = ["COMM_POWER_W", "LoadSettings", "NodeLoad", "PhaseMode"]
