"""Decisions: run a policy, evaluate its candidates, apply the reliability constraint.

The engine is shared by the simulator and the online service. It never
mutates the hall; the caller places the chosen nodes when ``placed`` is true.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from services.allocator.model import IntArray, Thermal
from services.allocator.policies import PolicyOptions, Request, View, create
from services.allocator.state import HallState


@dataclass(frozen=True)
class Outcome:
    """The hall if a job ran on ``nodes``."""

    nodes: list[int]
    cc: float
    lf: float
    node_power_w: float
    max_tin_c: float
    supply_c: float
    cop: float
    computing_kw: float
    cooling_kw: float
    min_mttf_years: float
    utilization: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """What a policy chose for one job, and whether the job may start now."""

    policy: str
    size: int
    comm_share: float
    placed: bool
    reason: str
    """``placed``; ``capacity`` (too few free nodes) or ``mttf`` (would shorten lifetimes): waits."""
    choice: Outcome | None
    runner_ups: list[Outcome] = field(default_factory=list)
    elapsed_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "policy": self.policy,
            "size": self.size,
            "comm_share": self.comm_share,
            "placed": self.placed,
            "reason": self.reason,
            "elapsed_ms": self.elapsed_ms,
        }
        doc.update(self.choice.as_dict() if self.choice else {"nodes": []})
        doc["runner_ups"] = [o.as_dict() for o in self.runner_ups]
        return doc


class Allocator:
    """A policy plus the reliability constraint, deciding over a :class:`HallState`."""

    def __init__(
        self,
        policy: str,
        options: PolicyOptions | None = None,
        min_mttf_years: float = 0.0,
        alternatives: int = 3,
    ) -> None:
        self.options = options or PolicyOptions()
        self.policy = create(policy, self.options)
        self.min_mttf_years = min_mttf_years
        self.alternatives = alternatives

    @property
    def policy_name(self) -> str:
        return self.policy.name

    def set_policy(self, name: str) -> None:
        self.policy = create(name, self.options)

    def decide(self, state: HallState, size: int, comm_share: float = 0.0) -> Decision:
        """Choose nodes for a job of ``size`` nodes (ValueError if it can never fit)."""
        started = time.perf_counter()
        model = state.model
        present = int(model.present.sum())
        if not 1 <= size <= present:
            raise ValueError(f"job size {size} must be between 1 and {present} (the hall's nodes)")
        if not 0.0 <= comm_share <= 1.0:
            raise ValueError(f"comm_share {comm_share} must be between 0 and 1")
        if size > state.free_count:
            return Decision(self.policy_name, size, comm_share, False, "capacity", None)
        view = View(model, state.free.copy(), state.powers_w.copy())
        request = Request(size, model.power.busy_w(comm_share, 1.0), comm_share)
        candidates = self.policy.choose(view, request, self.alternatives)
        outcomes = [self.evaluate(state, c, comm_share) for c in candidates]
        choice = outcomes[0]
        ok = self.min_mttf_years <= 0 or choice.min_mttf_years >= self.min_mttf_years
        return Decision(
            self.policy_name,
            size,
            comm_share,
            ok,
            "placed" if ok else "mttf",
            choice,
            outcomes[1:],
            (time.perf_counter() - started) * 1e3,
        )

    @staticmethod
    def evaluate(state: HallState, nodes: npt.ArrayLike, comm_share: float = 0.0) -> Outcome:
        """The hall's numbers if a job with ``comm_share`` ran on ``nodes`` (busy nodes kept)."""
        model = state.model
        idx: IntArray = np.sort(np.asarray(nodes, dtype=np.int64))
        cc = model.cc(idx)
        lf = model.lf(idx, cc)
        power = model.power.busy_w(comm_share, lf)
        powers = state.powers_w.copy()
        powers[idx] = power
        busy = state.busy.copy()
        busy[idx] = True
        th = model.assess(powers, busy)
        return _outcome(idx.tolist(), cc, lf, power, th, float(busy.sum() / model.present.sum()))


def current(state: HallState) -> Thermal:
    """The hall's numbers as it is now."""
    return state.model.assess(state.powers_w, state.busy)


def _outcome(
    nodes: list[int], cc: float, lf: float, power: float, th: Thermal, util: float
) -> Outcome:
    return Outcome(nodes=nodes, cc=cc, lf=lf, node_power_w=power, utilization=util, **th.totals())
