"""The demo's hall in simulated time: the shipped job stream, policies, load model and physics.

What ``kelvin up --demo`` does in real time, driven by a fake clock so minutes
take a second: the allocator's :class:`JobBook` places the job stream of
``allocator.job_stream`` (its defaults, drawn as ``services/allocator/demo.py``
draws them), the ``datacenter`` plugin's load model and
:class:`services.common.hall_physics.HallPhysics` (its defaults) turn the
placement into every node's power and the hall's temperatures every 250 ms,
and the plugin's sensor noise is added to what is "measured".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.allocator.engine import Allocator
from services.allocator.jobs import JobBook
from services.allocator.model import HallModel
from services.allocator.policies import PolicyOptions
from services.allocator.settings import JobStream
from services.common.hall_physics import HallPhysics
from services.common.thermal import Hall, reference_hall
from services.pusher.plugins.datacenter import DatacenterConfig
from services.pusher.plugins.datacenter_load import NodeLoad

NS = 1_000_000_000
Float64Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DemoRun:
    """What the simulated hall's sensors read, one row per 250 ms sample."""

    hall: Hall
    times_ns: npt.NDArray[np.int64]
    power_w: Float64Array
    """Per node, with the power meters' noise."""
    inlet_c: Float64Array
    """Per node, with the inlet sensors' noise."""
    supply_c: Float64Array
    cooling_w: Float64Array
    it_w: Float64Array
    hottest_c: Float64Array
    """The true hottest inlet (no noise)."""
    utilization: Float64Array

    def window(self, seconds: float) -> DemoRun:
        """The first ``seconds`` of the run."""
        n = int(seconds * NS // (self.times_ns[1] - self.times_ns[0]))
        return DemoRun(self.hall, *(getattr(self, f)[:n] for f in _SERIES))


_SERIES = (
    "times_ns", "power_w", "inlet_c", "supply_c", "cooling_w", "it_w", "hottest_c", "utilization",
)  # fmt: skip


def simulate(policy: str, seconds: float, seed: int = 1) -> DemoRun:
    """``seconds`` of the default demo under ``policy``, job stream and noise seeded by ``seed``."""
    hall = reference_hall()
    stream, plugin = JobStream(), DatacenterConfig()
    book = JobBook(HallModel(hall), Allocator(policy, PolicyOptions(seed=seed)))
    jobs = np.random.default_rng(seed)
    rng = np.random.default_rng(seed + 1000)
    load = NodeLoad(plugin.load(hall), rng)
    physics = HallPhysics(hall, plugin.physics())
    step_ns = plugin.interval_ms * 1_000_000
    n = hall.n_nodes
    steps = int(seconds * NS // step_ns)
    rows: dict[str, list[object]] = {f: [] for f in _SERIES}
    next_ns = round(jobs.exponential(stream.mean_interval_s) * NS)
    for k in range(steps):
        now = k * step_ns
        book.expire(now)
        while next_ns <= now:
            size = int(jobs.integers(stream.sizes[0], stream.sizes[1] + 1))
            runtime = float(jobs.uniform(*stream.runtime_s))
            if len(book.queue) < stream.max_queued:
                book.submit(size, next_ns, runtime, stream.comm_share, stretch=True)
            next_ns += round(jobs.exponential(stream.mean_interval_s) * NS)
        state = book.state
        power = load.powers_w(now / NS, state.powers_w, state.busy, state.owner)
        r = physics.step(now / NS, power)
        rows["times_ns"].append(now)
        rows["power_w"].append(power + rng.normal(0.0, plugin.noise_power_w, n))
        rows["inlet_c"].append(r.inlet_c + rng.normal(0.0, plugin.noise_temp_c, n))
        rows["supply_c"].append(r.supply_c)
        rows["cooling_w"].append(r.cooling_w)
        rows["it_w"].append(float(power.sum()))
        rows["hottest_c"].append(float(r.inlet_c.max()))
        rows["utilization"].append(state.utilization)
    return DemoRun(hall, *(np.array(rows[f]) for f in _SERIES))
