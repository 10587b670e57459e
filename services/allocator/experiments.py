"""The published experiments as data: which hall, which jobs, which power model.

* ``static-row``: jobs of 4, 5, 6, 3 nodes in that order on row 0 of the
  reference hall alone (row 1 absent: no power, no inlet); they never finish.
* ``static-hall``: :data:`STATIC_HALL_SIZES` (4, 5, 6, 3, 8, 2, 7, 4, 1 — 40
  nodes, filling the hall) on both rows; never finish.
* ``dynamic``: Poisson arrivals (``arrival_rate`` jobs/hour), sizes uniform
  in ``sizes``, base runtimes uniform in ``runtime_min`` minutes, one
  communication share for all jobs; run ``hours`` and measure after
  ``warmup_hours``. Everything is drawn from one seeded generator, so a seed
  fixes the job stream.

Static experiments use flat busy power (3500 W); dynamic ones weight it by
phase (3500 W computing, 2700 W communicating) and stretch runtimes by Lf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from services.allocator.model import HallModel, PowerModel
from services.common.errors import ConfigError
from services.common.thermal import Hall

EXPERIMENTS = ("static-row", "static-hall", "dynamic")
STATIC_ROW_SIZES = (4, 5, 6, 3)
STATIC_HALL_SIZES = (4, 5, 6, 3, 8, 2, 7, 4, 1)


@dataclass(frozen=True)
class JobSpec:
    """One job of an experiment (``base_runtime_s`` None: never finishes)."""

    job: int
    size: int
    arrival_s: float
    base_runtime_s: float | None
    comm_share: float


@dataclass(frozen=True)
class DynamicParams:
    """Inputs of the dynamic experiment (defaults documented in docs/allocator.md)."""

    seed: int = 1
    arrival_rate_per_h: float = 15.0
    comm_share: float = 0.2
    sizes: tuple[int, int] = (2, 8)
    runtime_min: tuple[float, float] = (5.0, 30.0)
    hours: float = 4.0
    warmup_hours: float = 1.0


@dataclass(frozen=True)
class Experiment:
    name: str
    model: HallModel
    jobs: list[JobSpec]
    duration_s: float | None = None
    measure_from_s: float = 0.0
    params: dict[str, object] = field(default_factory=dict)


def static_row(hall: Hall) -> Experiment:
    model = HallModel(
        hall.subset_rows([0]), power=PowerModel(hall.busy_power_w, phase_weighted=False)
    )
    jobs = _sequence("static-row", model, STATIC_ROW_SIZES)
    return Experiment("static-row", model, jobs, params={"sizes": STATIC_ROW_SIZES})


def static_hall(hall: Hall) -> Experiment:
    model = HallModel(hall, power=PowerModel(hall.busy_power_w, phase_weighted=False))
    jobs = _sequence("static-hall", model, STATIC_HALL_SIZES)
    return Experiment("static-hall", model, jobs, params={"sizes": STATIC_HALL_SIZES})


def _sequence(name: str, model: HallModel, sizes: tuple[int, ...]) -> list[JobSpec]:
    """The never-ending jobs of a static experiment; each must fit the (empty) hall."""
    present = int(model.present.sum())
    if max(sizes) > present:
        raise ConfigError(
            f"{name}: its largest job has {max(sizes)} nodes, hall {model.hall.name!r} "
            f"has {present}; use a larger hall"
        )
    return [JobSpec(k + 1, s, 0.0, None, 0.0) for k, s in enumerate(sizes)]


def dynamic(hall: Hall, p: DynamicParams) -> Experiment:
    lo, hi = p.sizes
    present = int(hall.present_mask.sum())
    if not 1 <= lo <= hi <= present:
        raise ConfigError(f"--sizes {lo}-{hi}: expected 1 <= low <= high <= {present} (hall nodes)")
    rlo, rhi = p.runtime_min
    if not 0 < rlo <= rhi:
        raise ConfigError(f"--runtime-min {rlo}-{rhi}: expected 0 < low <= high")
    if not 0 < p.arrival_rate_per_h < math.inf:
        raise ConfigError(f"--arrival-rate must be finite and > 0, got {p.arrival_rate_per_h}")
    if not 0 <= p.comm_share <= 1:
        raise ConfigError(f"--comm-share must be within [0, 1], got {p.comm_share}")
    if not p.hours < math.inf:
        raise ConfigError(f"--hours must be finite, got {p.hours}")
    if not 0 <= p.warmup_hours < p.hours:
        raise ConfigError("--warmup-hours must be >= 0 and below --hours")
    rng = np.random.default_rng(p.seed)
    duration = p.hours * 3600.0
    jobs: list[JobSpec] = []
    t = 0.0
    while True:
        t += float(rng.exponential(3600.0 / p.arrival_rate_per_h))
        if t >= duration:
            break
        size = int(rng.integers(lo, hi + 1))
        runtime = float(rng.uniform(rlo, rhi)) * 60.0
        jobs.append(JobSpec(len(jobs) + 1, size, t, runtime, p.comm_share))
    model = HallModel(hall, power=PowerModel(hall.busy_power_w, phase_weighted=True))
    return Experiment(
        "dynamic", model, jobs, duration, p.warmup_hours * 3600.0, params=dict(vars(p))
    )


def build(name: str, hall: Hall, params: DynamicParams) -> Experiment:
    if name == "static-row":
        return static_row(hall)
    if name == "static-hall":
        return static_hall(hall)
    if name == "dynamic":
        return dynamic(hall, params)
    raise ConfigError(f"unknown experiment {name!r}; expected one of {', '.join(EXPERIMENTS)}")
