"""Joint: MC1x1 shells opened at the nodes MPIT would pick; the coolest of them wins.

The nodes of the MPIT choice become candidate shell centres; each opens an
MC1x1 allocation (same shells and outermost-shell fill as :mod:`.mc1x1`,
except that equally compact fills of a shell go to the one with the lowest
peak inlet, the paper's tie rule, instead of the lowest node indices).
Among these the one with the lowest resulting peak inlet wins (peaks within
0.1 mK are equal), then the lower CC, then the lower centre index. A big job
has many MPIT nodes; only the ``joint_max_centres`` (16) with the best MC1x1
score (lowest sum of shell indices; ties: lower index) are opened, which
keeps a 1,000-node job on a 2,000-node hall well under a second.
"""

from __future__ import annotations

import numpy as np

from services.allocator.model import Float64Array, IntArray
from services.allocator.policies.base import (
    PEAK_TOLERANCE_C,
    Policy,
    Request,
    View,
    distinct,
    register,
)
from services.allocator.policies.mc1x1 import Fills, ShellHeat, allocation_at
from services.allocator.policies.mpit import Mpit, peak_after
from services.allocator.policies.shells import shell_scores

INCREMENTAL_MIN_NODES = 256
"""From this job size on, a centre's peak is the previous allocation's inlets plus the nodes
that differ (big jobs' allocations overlap almost entirely), not a sum over all its nodes."""


class _Peaks:
    """Peak inlets of successive allocations, each from the previous one's inlets."""

    def __init__(self, view: View, rise: Float64Array) -> None:
        self.view, self.rise = view, rise
        self.nodes: IntArray | None = None
        self.tin: Float64Array | None = None

    def of(self, nodes: IntArray) -> float:
        model = self.view.model
        if self.nodes is None or self.tin is None:
            tin = self.view.inlet_c + model.inlet_rise(nodes, self.rise)
        else:
            add = np.setdiff1d(nodes, self.nodes, assume_unique=True)
            drop = np.setdiff1d(self.nodes, nodes, assume_unique=True)
            tin = self.tin + model.inlet_rise(add, self.rise) - model.inlet_rise(drop, self.rise)
        self.nodes, self.tin = nodes, tin
        return float(tin.max())


@register
class Joint(Policy):
    """Cooling and communication together."""

    name = "joint"
    summary = "MC1x1 shells centred on MPIT's nodes; the lowest peak inlet wins, then lower CC"

    def choose(self, view: View, request: Request, alternatives: int) -> list[IntArray]:
        model, free, n = view.model, view.free_idx, request.size
        centres = Mpit(self.options).choose(view, request, 0)[0]
        limit = self.options.joint_max_centres
        if len(centres) > limit:
            score = shell_scores(model, free, n, centres)
            centres = np.sort(centres[np.lexsort((centres, score))[:limit]])
        rise = view.rise_per_node(request.power_w)
        heat = ShellHeat(view, rise)  # equally compact fills: the coolest (the paper's tie rule)
        ranked = []
        fills: Fills = {}
        keys: dict[bytes, tuple[int, float]] = {}  # centres often share an allocation
        peaks = _Peaks(view, rise) if n >= INCREMENTAL_MIN_NODES else None
        for c in centres.tolist():
            nodes = allocation_at(
                model, free, int(c), n, self.options.mc_exact_fill_limit, fills, heat
            )
            key = keys.get(nodes.tobytes())
            if key is None:
                peak = peaks.of(nodes) if peaks is not None else peak_after(view, rise, nodes)
                key = keys[nodes.tobytes()] = (
                    round(peak / PEAK_TOLERANCE_C),
                    round(model.cc(nodes), 9),
                )
            ranked.append((*key, int(c), nodes))
        ranked.sort(key=lambda r: r[:3])
        return distinct([r[3] for r in ranked], alternatives + 1)
