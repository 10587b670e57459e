"""Per-job accounting from stored telemetry: energy (IT and attributed cooling), duration, peak inlet.

A job is its DCDB job record (``/DCDB_JOBDATA/``: id, user, start, end,
nodes). For each of its nodes the power sensor (``{node}/power`` by
default) is read around the job's time and taken as the piecewise-linear
signal through its readings, which is integrated exactly over
``[start, end]`` (between readings by the trapezoid; at the edges the
signal is interpolated from the readings on either side, or held at the
nearest one: ``complete`` is false until every node has a reading after the
end). The job's IT energy is the sum over its nodes.

Cooling is attributed through the hall model: at every instant the CRAC
draws ``P_AC = ΣP / CoP(Tsup')`` with ``Tsup' = Tsup + Tred - max Tin``, the
hottest *measured* inlet of the hall; each watt of IT power carries the same
``1 / CoP(Tsup')`` of it, so the job's cooling energy is
``∫ P_job(t) / CoP(Tsup'(t)) dt`` (over a grid of at most ``grid_step_s``),
and the jobs' shares plus the idle nodes' add up to the hall's cooling. The
peak inlet is the hottest reading of the job's own nodes' inlets during
the job. The policy that placed the job comes from the allocator's
``<prefix>/placed/<policy>`` sensors (value: the job's number).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.readings import Float64Array, Int64Array, Series
from services.common.sensors import JobRecord
from services.common.storage.base import StorageBackend
from services.common.thermal import Hall, node_sensor

NS = 1_000_000_000
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class AccountingConfig:
    """Where a job's sensors are and how the cooling is attributed."""

    hall: Hall
    power_sensor: str = "{node}/power"
    inlet_sensor: str = "{node}/inlet_temp"
    allocator_prefix: str = "/kelvin/allocator"
    margin_s: float = 30.0
    """Readings this far outside the job are read to interpolate its edges."""
    grid_step_s: float = 1.0
    """Finest step of the cooling attribution's grid."""
    max_grid_points: int = 200_000

    def hall_inlets(self) -> list[str]:
        h = self.hall
        nodes = [
            node_sensor(h, int(i), "x").rsplit("/", 1)[0] for i in np.flatnonzero(h.present_mask)
        ]
        return [self.inlet_sensor.format(node=n) for n in nodes]


def integral(ts: Int64Array, vs: Float64Array, start_ns: int, end_ns: int) -> float:
    """∫ of the piecewise-linear signal through (ts, vs) over [start, end], in value·s.

    NaN readings are left out. Before the first and after the last reading the
    signal is held at that reading. No reading at all: NaN.
    """
    ok = ~np.isnan(vs)
    ts, vs = ts[ok], vs[ok]
    if ts.size == 0 or end_ns <= start_ns:
        return float("nan") if ts.size == 0 else 0.0
    inside = (ts > start_ns) & (ts < end_ns)
    t = np.concatenate([[start_ns], ts[inside], [end_ns]]).astype(np.float64)
    v = np.interp(t, ts.astype(np.float64), vs)
    return float(np.sum((v[1:] + v[:-1]) * 0.5 * np.diff(t)) / NS)


def job_number(job_id: str) -> float | None:
    digits = re.sub(r"\D", "", job_id)
    return float(digits) if digits and len(digits) <= 15 else None


async def placed_by(
    storage: StorageBackend, prefix: str, start_ns: int, end_ns: int
) -> dict[float, str]:
    """Job number -> the policy that placed it, from ``<prefix>/placed/<policy>`` readings."""
    base = f"{prefix.rstrip('/')}/placed"
    names = [n for n in await storage.sensors(base) if n.count("/") == base.count("/") + 1]
    series = await storage.read_many(names, start_ns, end_ns)
    found: dict[float, str] = {}
    for name, s in series.items():
        for v in s.values.tolist():
            found.setdefault(float(v), name.rsplit("/", 1)[1])
    return found


async def account(
    storage: StorageBackend,
    job: JobRecord,
    cfg: AccountingConfig,
    now_ns: int,
    policies: dict[float, str] | None = None,
) -> dict[str, Any]:
    """The accounting of one job (running jobs: up to ``now_ns``)."""
    start, end = job.start_ns, job.end_ns if job.end_ns is not None else now_ns
    margin = round(cfg.margin_s * NS)
    lo, hi = max(0, start - margin), min(end + margin, 2**63 - 1)
    powers = [cfg.power_sensor.format(node=n) for n in job.nodes]
    inlets = [cfg.inlet_sensor.format(node=n) for n in job.nodes]
    hall_inlets = cfg.hall_inlets()
    wanted = sorted(set(powers) | set(inlets) | set(hall_inlets))
    data = await storage.read_many(wanted, lo, hi)
    missing = [p for p in powers if data[p].timestamps_ns.size == 0]
    # final once every node has a reading on both sides of the job (else the edges are held)
    complete = job.end_ns is not None and all(
        data[p].timestamps_ns.size
        and data[p].timestamps_ns[0] <= start
        and data[p].timestamps_ns[-1] >= end
        for p in powers
    )
    it_j = sum(
        (
            integral(data[p].timestamps_ns, data[p].values, start, end)
            for p in powers
            if p not in missing
        ),
        0.0,
    )
    cooling_j = _cooling(data, powers, hall_inlets, cfg, start, end)
    peak = _peak([data[i] for i in inlets], start, end)
    if policies is None:
        policies = await placed_by(storage, cfg.allocator_prefix, start - 60 * NS, start + 60 * NS)
    number = job_number(job.job_id)
    duration = (end - start) / NS
    return {
        "job_id": job.job_id,
        "domain_id": job.domain_id,
        "user": job.user_id or None,
        "start_ns": job.start_ns,
        "end_ns": job.end_ns,
        "running": job.running,
        "duration_s": duration,
        "nodes": list(job.nodes),
        "policy": policies.get(number) if number is not None else None,
        "it_energy_j": it_j,
        "it_energy_kwh": it_j / J_PER_KWH,
        "cooling_energy_j": cooling_j,
        "cooling_energy_kwh": cooling_j / J_PER_KWH,
        "total_energy_kwh": (it_j + cooling_j) / J_PER_KWH,
        "avg_power_w": it_j / duration if duration > 0 else None,
        "peak_inlet_c": peak,
        "missing_sensors": missing,
        "complete": bool(complete),
    }


def _grid(start: int, end: int, step_s: float, limit: int) -> Int64Array:
    step = max(round(step_s * NS), (end - start) // max(limit - 1, 1), 1)
    return np.unique(np.r_[np.arange(start, end, step, dtype=np.int64), end])


def _at(s: Series, t: Int64Array) -> Float64Array:
    ok = ~np.isnan(s.values)
    if not ok.any():
        return np.full(t.shape, np.nan)
    return np.interp(t.astype(np.float64), s.timestamps_ns[ok].astype(np.float64), s.values[ok])


def _cooling(
    data: dict[str, Series],
    powers: Sequence[str],
    inlets: Sequence[str],
    cfg: AccountingConfig,
    start: int,
    end: int,
) -> float:
    """∫ P_job / CoP(Tsup + Tred - max measured Tin) dt over a grid of the job's time."""
    if end <= start:
        return 0.0
    t = _grid(start, end, cfg.grid_step_s, cfg.max_grid_points)
    p = np.zeros(t.shape)
    for name in powers:
        if data[name].timestamps_ns.size:
            p += _at(data[name], t)
    tin = np.full(t.shape, -np.inf)
    for name in inlets:
        if data[name].timestamps_ns.size:
            tin = np.fmax(tin, _at(data[name], t))
    if not np.isfinite(tin).any():
        return float("nan")
    hall = cfg.hall
    raised = np.where(np.isfinite(tin), hall.supply_c + hall.redline_c - tin, np.nan)
    rate = p / np.asarray(hall.cop(raised))  # type: ignore[arg-type]
    return float(np.sum((rate[1:] + rate[:-1]) * 0.5 * np.diff(t)) / NS)


def _peak(series: Sequence[Series], start: int, end: int) -> float | None:
    best = -np.inf
    for s in series:
        inside = (s.timestamps_ns >= start) & (s.timestamps_ns <= end) & ~np.isnan(s.values)
        if inside.any():
            best = max(best, float(s.values[inside].max()))
    return best if np.isfinite(best) else None
