"""Random baseline: n free nodes drawn uniformly, reproducible from the seed."""

from __future__ import annotations

import numpy as np

from services.allocator.model import IntArray
from services.allocator.policies.base import (
    Policy,
    PolicyOptions,
    Request,
    View,
    distinct,
    register,
)


@register
class RandomPick(Policy):
    """Uniformly random free nodes; the runner-ups are further draws of the same generator."""

    name = "random"
    summary = "baseline: uniformly random free nodes (seeded)"

    def __init__(self, options: PolicyOptions | None = None) -> None:
        super().__init__(options)
        self.rng = np.random.default_rng(self.options.seed)

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        free = view.free_idx
        draws = [
            np.sort(self.rng.choice(free, size=request.size, replace=False))
            for _ in range(alternatives + 1)
        ]
        return distinct(draws, alternatives + 1)
