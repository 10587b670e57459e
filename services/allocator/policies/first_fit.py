"""First-fit baseline: the lowest-index free nodes."""

from __future__ import annotations

from services.allocator.model import IntArray
from services.allocator.policies.base import Policy, Request, View, distinct, register


@register
class FirstFit(Policy):
    """The n free nodes with the lowest indices; runner-ups start one free node later each."""

    name = "first-fit"
    summary = "baseline: the lowest-index free nodes"

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        free, n = view.free_idx, request.size
        windows = [free[k : k + n] for k in range(0, min(alternatives, len(free) - n) + 1)]
        return distinct(windows, alternatives + 1)
