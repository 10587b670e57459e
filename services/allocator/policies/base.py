"""The policy interface and its registry.

A policy looks at the hall (free nodes, current powers) and a job request and
returns candidate node sets, best first: the first is its choice, the rest
are the runner-ups a decision reports. Policies never mutate state and
never judge reliability; :mod:`services.allocator.engine` does both.
Adding a policy: one module with a :func:`register`-ed subclass, one line in
``policies/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from services.allocator.model import Float64Array, HallModel, IntArray
from services.common.errors import ConfigError

PEAK_TOLERANCE_C = 1e-4
"""Peaks this close count as equal: far above HiGHS's 1e-6 optimality gap, far below physics."""


@dataclass(frozen=True)
class PolicyOptions:
    """Tuning shared by all policies (each reads what concerns it)."""

    seed: int = 0
    """Seed of the ``random`` policy."""
    mpit_exact_max_free: int = 600
    """MPIT solves exactly (search, MILP fallback) while at most this many nodes are free."""
    mpit_time_limit_s: float = 1.0
    """Cap on MPIT's exact solver, all steps together; on time-out the better of incumbent and greedy."""
    joint_max_centres: int = 16
    """Joint opens shells at no more of MPIT's nodes than this (the most compact centres)."""
    mc_tie_limit: int = 64
    """MC1x1 evaluates CC for at most this many equally scored centres (lowest indices)."""
    mc_exact_fill_limit: int = 5000
    """MC1x1 fills the outermost shell exactly when at most this many subsets exist."""


@dataclass(frozen=True)
class Request:
    """What a policy places: ``size`` nodes that will each draw ``power_w``."""

    size: int
    power_w: float
    comm_share: float = 0.0


@dataclass
class View:
    """The hall as a policy sees it when deciding."""

    model: HallModel
    free: npt.NDArray[np.bool_]
    powers_w: Float64Array
    memo: dict[str, Any] = field(default_factory=dict)
    """What one decision computes once and several steps reuse (keyed by what it is)."""

    @cached_property
    def free_idx(self) -> IntArray:
        return np.flatnonzero(self.free).astype(np.int64)

    @cached_property
    def inlet_c(self) -> Float64Array:
        """Current Tin; absent nodes at -inf so that they never set the peak."""
        tin = self.model.inlet_c(self.powers_w)
        return np.where(self.model.present, tin, -np.inf)

    def rise_per_node(self, power_w: float) -> Float64Array:
        """ΔP_j: how much a free node's power rises when it joins the job."""
        return np.asarray(power_w - self.powers_w, dtype=np.float64)


class Policy(ABC):
    """A placement policy."""

    name: ClassVar[str]
    summary: ClassVar[str]

    def __init__(self, options: PolicyOptions | None = None) -> None:
        self.options = options or PolicyOptions()

    @abstractmethod
    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        """Candidate node sets (sorted indices), best first; at least one when enough are free."""


REGISTRY: dict[str, type[Policy]] = {}
P = TypeVar("P", bound=type[Policy])


def register(cls: P) -> P:
    REGISTRY[cls.name] = cls
    return cls


def create(name: str, options: PolicyOptions | None = None) -> Policy:
    """The policy registered as ``name``; ConfigError naming the known ones otherwise."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown allocation policy {name!r}; expected one of {', '.join(sorted(REGISTRY))}"
        ) from None
    return cls(options)


def distinct(candidates: list[IntArray], limit: int) -> list[IntArray]:
    """Drop repeated node sets, keep order, at most ``limit``."""
    seen: set[tuple[int, ...]] = set()
    out: list[IntArray] = []
    for c in candidates:
        key = tuple(np.sort(c).tolist())
        if key not in seen:
            seen.add(key)
            out.append(np.array(key, dtype=np.int64))
        if len(out) == limit:
            break
    return out
