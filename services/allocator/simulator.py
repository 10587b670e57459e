"""Event-driven simulation of one policy over one experiment.

Events are arrivals and completions (completions first at equal times).
After every event the queue head is offered to the allocator, first come
first served without backfilling: it starts if the policy finds nodes and the
reliability constraint allows; otherwise it and everyone behind it wait. A
head job stalled by the MTTF constraint while nothing runs can never start
(the hall will not get cooler) and is rejected, so one job cannot stop the
hall forever. Energy and averages integrate the step-wise series over the
measured window.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from services.allocator.communication import runtime_stretch
from services.allocator.engine import Allocator, current
from services.allocator.experiments import Experiment, JobSpec
from services.allocator.policies import PolicyOptions
from services.allocator.state import HallState

SERIES_FIELDS = (
    "t_s",
    "utilization",
    "computing_kw",
    "cooling_kw",
    "max_tin_c",
    "supply_c",
    "queued",
    "running",
)


@dataclass
class PolicyRun:
    """What one policy did: a record per job, a time series, a summary, the final hall."""

    policy: str
    records: list[dict[str, Any]] = field(default_factory=list)
    series: list[tuple[float, ...]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    final_owner: list[str | None] = field(default_factory=list)
    final_inlet_c: list[float] = field(default_factory=list)
    power_times_s: list[float] = field(default_factory=list)
    power_snapshots: list[npt.NDArray[np.float64]] = field(default_factory=list)
    """Node powers after every event (only with ``record_powers``)."""

    def power_trace(self, step_s: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Node powers sampled every ``step_s`` (as a power meter would see them)."""
        if not self.power_snapshots:
            raise ValueError("run the simulation with record_powers=True")
        t = np.asarray(self.power_times_s)
        grid = np.arange(t[0], t[-1], step_s)
        idx = np.searchsorted(t, grid, side="right") - 1
        return grid, np.asarray(self.power_snapshots)[idx]


def run(
    exp: Experiment,
    policy: str,
    seed: int = 0,
    min_mttf_years: float = 0.0,
    record_powers: bool = False,
) -> PolicyRun:
    allocator = Allocator(policy, PolicyOptions(seed=seed), min_mttf_years=min_mttf_years)
    sim = _Simulation(exp, allocator, record_powers)
    sim.run()
    return sim.result


class _Simulation:
    def __init__(self, exp: Experiment, allocator: Allocator, record_powers: bool) -> None:
        self.exp = exp
        self.record_powers = record_powers
        self.allocator = allocator
        self.state = HallState(exp.model)
        self.result = PolicyRun(allocator.policy_name)
        self.queue: deque[JobSpec] = deque()
        self.events: list[tuple[float, int, int, JobSpec]] = []
        self.stalled: set[int] = set()
        self.rejected = 0
        self.finished = 0
        self.now = 0.0

    def run(self) -> None:
        for spec in self.exp.jobs:
            heapq.heappush(self.events, (spec.arrival_s, 1, spec.job, spec))
        end = self.exp.duration_s
        self._sample()
        while self.events:
            t, kind, _, spec = heapq.heappop(self.events)
            if end is not None and t >= end:
                break
            self.now = t
            if kind == 0:
                self.state.release(str(spec.job))
                self.finished += 1
            else:
                self.queue.append(spec)
            if not self.events or self.events[0][0] != t:
                self._start_queued()
                self._sample()
        if end is not None:
            self.now = end
            self._sample()
        for spec in self.queue:
            self.result.records.append(self._waiting_record(spec))
        self.result.summary = self._summary()
        self.result.final_owner = list(self.state.owner)
        self.result.final_inlet_c = current(self.state).inlet_c.tolist()

    def _start_queued(self) -> None:
        while self.queue:
            spec = self.queue[0]
            d = self.allocator.decide(self.state, spec.size, spec.comm_share)
            if not d.placed:
                if d.reason == "mttf":
                    self.stalled.add(spec.job)
                    if not self.state.jobs:
                        self.queue.popleft()
                        self.rejected += 1
                        self.result.records.append(self._waiting_record(spec, "rejected"))
                        continue
                return
            assert d.choice is not None
            c = d.choice
            self.queue.popleft()
            self.state.place(str(spec.job), c.nodes, c.node_power_w)
            runtime = None
            if spec.base_runtime_s is not None:
                runtime = spec.base_runtime_s * runtime_stretch(spec.comm_share, c.lf)
                heapq.heappush(self.events, (self.now + runtime, 0, spec.job, spec))
            rec = self._record(spec, "placed")
            rec.update(c.as_dict())
            rec.update(
                start_s=self.now,
                wait_s=self.now - spec.arrival_s,
                runtime_s=runtime,
                end_s=None if runtime is None else self.now + runtime,
            )
            self.result.records.append(rec)

    def _record(self, spec: JobSpec, status: str) -> dict[str, Any]:
        return {
            "policy": self.allocator.policy_name,
            "job": spec.job,
            "size": spec.size,
            "status": status,
            "arrival_s": spec.arrival_s,
        }

    def _waiting_record(self, spec: JobSpec, status: str = "waiting") -> dict[str, Any]:
        th = current(self.state)
        rec = self._record(spec, status)
        rec.update(nodes=[], utilization=self.state.utilization, cc=None, lf=None, **th.totals())
        rec.update(start_s=None, wait_s=None)
        return rec

    def _sample(self) -> None:
        th = current(self.state)
        row = (
            self.now,
            self.state.utilization,
            th.computing_kw,
            th.cooling_kw,
            th.max_tin_c,
            th.supply_c,
            float(len(self.queue)),
            float(len(self.state.jobs)),
        )
        if self.result.series and self.result.series[-1][0] == self.now:
            self.result.series[-1] = row
        else:
            self.result.series.append(row)
        if self.record_powers:
            res = self.result
            if res.power_times_s and res.power_times_s[-1] == self.now:
                res.power_snapshots[-1] = self.state.powers_w.copy()
            else:
                res.power_times_s.append(self.now)
                res.power_snapshots.append(self.state.powers_w.copy())

    def _summary(self) -> dict[str, Any]:
        if self.exp.duration_s is None:
            return self._static_summary()
        s = np.array(self.result.series, dtype=np.float64).reshape(-1, len(SERIES_FIELDS))
        start = self.exp.measure_from_s
        stop = self.exp.duration_s if self.exp.duration_s is not None else float(s[-1, 0])
        t = np.clip(np.r_[s[:, 0], stop], start, stop)
        dt = np.diff(t)
        span_s = max(float(dt.sum()), 1e-12)

        def avg(col: int) -> float:
            return float((s[:, col] * dt).sum() / span_s) if dt.sum() > 0 else float(s[-1, col])

        placed = [r for r in self.result.records if r["status"] == "placed"]
        window = [r for r in placed if r["start_s"] >= start]
        multi = [r for r in window if r["size"] > 1]
        waited = [r for r in window if r["wait_s"] > 0]
        in_window = (s[:, 0] >= start) & (s[:, 0] <= stop)
        return {
            "policy": self.allocator.policy_name,
            "jobs": len(self.exp.jobs),
            "started": len(placed),
            "finished": self.finished,
            "avg_utilization": avg(1),
            "avg_computing_kw": avg(2),
            "avg_cooling_kw": avg(3),
            "cooling_energy_kwh": avg(3) * span_s / 3600.0,
            "computing_energy_kwh": avg(2) * span_s / 3600.0,
            "avg_max_tin_c": avg(4),
            "peak_max_tin_c": float(s[in_window, 4].max()) if in_window.any() else float(s[-1, 4]),
            "mean_cc": float(np.mean([r["cc"] for r in multi])) if multi else 0.0,
            "mean_lf": float(np.mean([r["lf"] for r in multi])) if multi else 1.0,
            "waits": len(waited),
            "mean_wait_s": float(np.mean([r["wait_s"] for r in window])) if window else 0.0,
            "stalls": len(self.stalled),
            "rejected": self.rejected,
            "still_queued": len(self.queue),
        }

    def _static_summary(self) -> dict[str, Any]:
        th = current(self.state)
        placed = [r for r in self.result.records if r["status"] == "placed"]
        multi = [r["cc"] for r in placed if r["size"] > 1]
        return {
            "policy": self.allocator.policy_name,
            "jobs": len(self.exp.jobs),
            "started": len(placed),
            "utilization": self.state.utilization,
            "computing_kw": th.computing_kw,
            "cooling_kw": th.cooling_kw,
            "max_tin_c": th.max_tin_c,
            "supply_c": th.supply_c,
            "mean_cc": float(np.mean(multi)) if multi else 0.0,
            "total_cc": float(np.sum(multi)) if multi else 0.0,
            "sequence_cooling_kw": float(np.mean([r["cooling_kw"] for r in placed]))
            if placed
            else th.cooling_kw,
            "min_mttf_years": th.min_mttf_years,
        }


def run_policies(
    exp: Experiment, policies: list[str], seed: int = 0, min_mttf_years: float = 0.0
) -> list[PolicyRun]:
    """Every policy over the same experiment (the same job stream)."""
    return [run(exp, p, seed, min_mttf_years) for p in policies]
