"""Small halls and views shared by the policy tests."""

from __future__ import annotations

import numpy as np

from services.allocator.model import HallModel
from services.allocator.policies import View
from services.common.thermal import Hall


def random_hall(seed: int, rows: int = 2, racks: int = 2, slots: int = 3) -> Hall:
    """A hall with a seeded random D, 60 % dense, no locality (hard for every exact method)."""
    rng = np.random.default_rng(seed)
    n = rows * racks * slots
    d = rng.uniform(0, 4e-4, (n, n)) * (rng.random((n, n)) < 0.6)
    return Hall(rows, racks, slots, d, name=f"random-{seed}")


def view_of(model: HallModel, busy: np.ndarray, idle_w: float | None = None) -> View:
    """Busy nodes at the hall's busy power, free ones idle, absent ones off (as HallState does)."""
    hall = model.hall
    idle = hall.idle_power_w if idle_w is None else idle_w
    powers = np.where(busy, hall.busy_power_w, idle)
    return View(model, model.present & ~busy, np.where(model.present, powers, 0.0))
