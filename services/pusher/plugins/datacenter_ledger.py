"""The simulated hall's books per placement policy: IT and cooling energy, time over the redline.

A real hall's meters do not know who placed its jobs; the simulated one does
(the allocator's hall document names its policy). So that runs of
``kelvin up --demo --policy random`` and ``--policy joint`` can be compared
side by side, the ``datacenter`` plugin adds what the hall drew and spent
while each policy was placing its jobs, and publishes the running totals as
``/hall/policy/<policy>/it_energy`` and ``.../cooling_energy`` (kWh),
``.../run_time`` (s) and ``.../over_redline`` (node-seconds with an inlet over
the redline). The totals live in the plugin's state directory, so they carry
over restarts with the same data directory (at most one save interval is lost
to a kill -9).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from services.common.readings import Float64Array
from services.pusher.plugins.base import Group, GroupOptions, Sensor, SensorOptions

log = logging.getLogger(__name__)

POLICIES = ("joint", "mpit", "mc1x1", "first-fit", "random")
"""The allocator's policies (``allocator.policy``); others are not booked."""
QUANTITIES = (("it_energy", "kWh"), ("cooling_energy", "kWh"), ("run_time", "s"),
              ("over_redline", "s"))  # fmt: skip
MAX_STEP_S = 10.0
"""A longer pause between two samples (the pusher stopped) is not booked as running time."""
J_PER_KWH = 3.6e6


class Ledger:
    """Per policy: the totals of :data:`QUANTITIES`, loaded from and saved to ``path``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.totals = {p: dict.fromkeys([q for q, _ in QUANTITIES], 0.0) for p in POLICIES}
        if path is not None and path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                for p in POLICIES:
                    for q, _ in QUANTITIES:
                        v = float(saved.get(p, {}).get(q, 0.0))
                        self.totals[p][q] = v if math.isfinite(v) and v >= 0 else 0.0
            except (OSError, ValueError, AttributeError, TypeError) as exc:
                log.warning(
                    "datacenter: policy ledger %s unreadable (%s); starting from 0", path, exc
                )

    def add(
        self, policy: str | None, dt_s: float, it_w: float, cooling_w: float, over: int
    ) -> None:
        """Book ``dt_s`` seconds of the hall under ``policy``."""
        books = self.totals.get(policy or "")
        if books is None or not 0 < dt_s <= MAX_STEP_S:
            return
        books["it_energy"] += it_w * dt_s / J_PER_KWH
        books["cooling_energy"] += cooling_w * dt_s / J_PER_KWH
        books["run_time"] += dt_s
        books["over_redline"] += over * dt_s

    def values(self) -> Float64Array:
        """Every total, in the order of :func:`sensors`."""
        return np.array([self.totals[p][q] for p in POLICIES for q, _ in QUANTITIES])

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.totals), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("datacenter: cannot save the policy ledger %s: %s", self.path, exc)


def sensors(prefix: str, opts: SensorOptions) -> list[Sensor]:
    """``<prefix>/policy/<policy>/<quantity>`` for every policy and quantity."""
    return [
        Sensor(f"{prefix}/policy/{p}/{q}", opts, unit, monotonic=True)
        for p in POLICIES
        for q, unit in QUANTITIES
    ]


class LedgerGroup(Group):
    """The running totals, published (and saved) every few seconds."""

    def __init__(
        self, name: str, sensors: list[Sensor], options: GroupOptions, ledger: Ledger
    ) -> None:
        super().__init__(name, sensors, options)
        self.ledger = ledger

    def read(self, timestamp_ns: int) -> Float64Array:
        self.ledger.save()
        return self.ledger.values()

    def close(self) -> None:
        self.ledger.save()


__all__ = ["POLICIES", "QUANTITIES", "Ledger", "LedgerGroup", "sensors"]
