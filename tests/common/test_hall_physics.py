"""The simulated hall's dynamics against hand-computed values: lag, CRAC control, cooling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.common.hall_physics import HallPhysics, Physics, lag_factor, lagged
from services.common.thermal import Hall, HallError

D = np.array([[0.001, 0.002], [0.0, 0.001]])
"""Two nodes: node 1's heat reaches node 0's inlet (2 mK/W), each warms its own (1 mK/W)."""


def two_nodes(**physics: float) -> HallPhysics:
    return HallPhysics(Hall(1, 1, 2, D), Physics(**physics))


def test_heat_follows_power_with_the_time_constant() -> None:
    hall = two_nodes(time_constant_s=10.0, supply_rate_c_per_s=1e-9)
    first = hall.step(0.0, [1000.0, 1000.0])
    # steady state at the first power: Tin = 15 + D·P = [18, 16]; Tout adds P / K (3.41 K)
    np.testing.assert_allclose(first.inlet_c, [18.0, 16.0])
    np.testing.assert_allclose(first.outlet_c - first.inlet_c, 1000.0 / 293.49, atol=1e-3)
    after = {}
    for k in range(1, 41):  # node 1 steps to 3000 W, sampled every 250 ms
        after[k * 0.25] = hall.step(k * 0.25, [1000.0, 3000.0])
    one_tau = after[10.0]
    assert one_tau.heat_w[1] == pytest.approx(1000.0 + 2000.0 * (1 - math.exp(-1)))
    assert one_tau.power_w[1] == 3000.0  # the electrical power jumped at once
    assert one_tau.inlet_c[0] == pytest.approx(15.0 + 0.001 * 1000 + 0.002 * one_tau.heat_w[1])


def test_lagged_replays_the_halls_integration_for_uneven_samples() -> None:
    """Calibration undoes the lag on the sampled powers: it must integrate as the hall did."""
    rng = np.random.default_rng(0)
    dts = rng.choice([0.25, 0.5, 1.0], 200)  # a pusher that sometimes skips reads
    times_s = np.concatenate([[0.0], np.cumsum(dts)])
    powers = rng.uniform(1000.0, 3500.0, (len(times_s), 2))
    hall = two_nodes(time_constant_s=20.0)
    heat = np.array([hall.step(t, p).heat_w for t, p in zip(times_s, powers, strict=True)])
    times_ns = np.round(times_s * 1e9).astype(np.int64)
    np.testing.assert_allclose(lagged(times_ns, powers, 20.0), heat, rtol=1e-12)
    np.testing.assert_array_equal(lagged(times_ns, powers, 0.0), powers)
    assert lag_factor(20.0, 20.0) == pytest.approx(1 - math.exp(-1))
    assert lag_factor(1.0, 0.0) == 1.0


def test_the_crac_moves_at_its_rate_towards_redline_minus_margin() -> None:
    hall = two_nodes(time_constant_s=0.0, supply_rate_c_per_s=0.05, margin_c=2.0, gain_per_s=1.0)
    hall.step(0.0, [1000.0, 1000.0])  # hottest inlet 18 °C: the supply may rise by 10 K
    supply = [hall.step(k * 1.0, [1000.0, 1000.0]).supply_c for k in range(1, 400)]
    steps = np.diff([15.0, *supply])
    assert steps.max() == pytest.approx(0.05)  # 3 °C per minute, no faster
    # target: 30 - 2 - 3 = 25, but the CRAC's highest supply is 24 °C
    assert supply[-1] == pytest.approx(24.0, abs=1e-6)
    busy = [hall.step(400.0 + k, [3500.0, 3500.0]) for k in range(1, 400)]
    # now the rise is 0.001*3500 + 0.002*3500 = 10.5 K: supply 30 - 2 - 10.5 = 17.5
    assert busy[-1].supply_c == pytest.approx(17.5, abs=1e-3)
    assert max(r.inlet_c.max() for r in busy) > 30.0  # the load outran the CRAC for a while
    assert busy[-1].inlet_c.max() == pytest.approx(28.0, abs=1e-3)
    # cooling: the heat the air carries back over the CoP at the supply
    r = busy[-1]
    assert r.cooling_w == pytest.approx(7000.0 / (0.0068 * 17.5**2 + 0.0008 * 17.5 + 0.458))


def test_the_crac_stops_at_its_lowest_supply_and_the_redline_is_crossed() -> None:
    hall = two_nodes(time_constant_s=0.0, supply_min_c=12.0, supply_rate_c_per_s=1.0)
    for k in range(100):
        r = hall.step(float(k), [8000.0, 8000.0])  # rise 24 K: would need 3.5 °C supply
    assert r.supply_c == pytest.approx(12.0)
    assert r.inlet_c.max() == pytest.approx(36.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"time_constant_s": -1.0},
        {"supply_min_c": 25.0, "supply_max_c": 20.0},
        {"supply_rate_c_per_s": 0.0},
        {"margin_c": -0.5},
    ],
)
def test_inconsistent_physics_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(HallError):
        Physics(**bad)
