"""The demo's hall in simulated time: a thermal-aware policy keeps it under its redline, a poor
one crosses it, the physics is smooth, and calibration through the thermal lag recovers D.

Ten simulated minutes per policy (tests/support/demo_hall.py: the shipped job stream, load
model, physics and noise) take about a second each; the live demo (tests/test_demo.py) checks
the same physics on what it stored.
"""

from __future__ import annotations

import numpy as np
import pytest

from services.allocator.calibrate import Samples, compare, fit_lagged, standard_errors
from tests.support.demo_hall import DemoRun, simulate

MINUTES = 10
COOLING_SLOPE_KW_S = 3.0
"""docs/console.md: the hall's cooling power changes by at most this much per second."""
D_REL_BOUND = 0.10
TIN_RMSE_BOUND_C = 0.10
"""docs/allocator.md, "Closed loop": D within 10 %, predicted inlets within 0.1 °C RMS ..."""


@pytest.fixture(scope="module")
def runs() -> dict[str, DemoRun]:
    return {p: simulate(p, MINUTES * 60, seed=2) for p in ("joint", "random")}


def _pue_10s(run: DemoRun) -> np.ndarray:
    k = len(run.it_w) // 40 * 40
    it = run.it_w[:k].reshape(-1, 40).sum(axis=1)
    return (it + run.cooling_w[:k].reshape(-1, 40).sum(axis=1)) / it


def test_a_thermal_aware_policy_keeps_the_redline_a_poor_one_crosses_it(
    runs: dict[str, DemoRun],
) -> None:
    joint, random = runs["joint"], runs["random"]
    redline = joint.hall.redline_c
    over = {p: float(np.mean(r.hottest_c > redline)) for p, r in runs.items()}
    assert over["joint"] < 0.05 < 0.10 < over["random"], over
    # near the redline, not far below it: the CRAC spends the slack on warmer supply air
    assert np.median(joint.hottest_c) == pytest.approx(redline - 2.5, abs=0.3)
    assert np.median(joint.supply_c) > np.median(random.supply_c) + 3.0
    # ... which is what the cooling bill shows: cooling energy per IT energy
    ratio = {p: r.cooling_w.sum() / r.it_w.sum() for p, r in runs.items()}
    assert ratio["joint"] < 0.8 * ratio["random"], ratio


def test_the_physics_is_smooth_and_the_pue_realistic(runs: dict[str, DemoRun]) -> None:
    for policy, run in runs.items():
        dt_s = np.diff(run.times_ns) / 1e9
        slope = np.abs(np.diff(run.cooling_w)) / 1e3 / dt_s
        assert slope.max() < COOLING_SLOPE_KW_S, policy
        assert (np.abs(np.diff(run.supply_c)) / dt_s).max() <= 3.0 / 60 + 1e-9, policy  # 3 °C/min
        pue = _pue_10s(run)
        assert pue.min() > 1.15 and pue.max() < 2.1, (policy, pue.min(), pue.max())
    assert 1.2 < np.mean(_pue_10s(runs["joint"])) < 1.5


def test_calibration_through_the_lag_recovers_d_after_ten_minutes_of_random() -> None:
    """Random placements excite every node; the fit finds the 20 s time constant itself."""
    run = simulate("random", MINUTES * 60, seed=3)
    rise = Samples(run.times_ns, run.power_w, run.inlet_c - run.supply_c[:, None])
    fit, tau, lagged = fit_lagged(rise, 0.0)
    assert tau == pytest.approx(20.0, abs=0.5)
    assert fit.rmse_c == pytest.approx(0.1, rel=0.1)  # the inlet sensors' noise
    err = compare(fit.d_matrix, run.hall.d_matrix, run.hall)
    assert err["d_rel_frobenius"] < D_REL_BOUND and err["tin_rmse_c"] < TIN_RMSE_BOUND_C, err
    # Without the lag the same data give nothing useful.
    no_lag, _, _ = fit_lagged(rise, 0.0, 0.0)
    assert no_lag.rmse_c > 3 * fit.rmse_c
    assert compare(no_lag.d_matrix, run.hall.d_matrix, run.hall)["d_rel_frobenius"] > 0.5
    expected = standard_errors(lagged, fit, run.hall)
    assert err["d_rel_frobenius"] < expected["d_rel_frobenius"] < 3 * err["d_rel_frobenius"]


def test_under_joint_the_report_names_what_it_cannot_know(runs: dict[str, DemoRun]) -> None:
    """Joint keeps the hot aisle-end nodes idle: their columns of D stay unknown, and the
    report's own estimate says so (it never claims better than it is)."""
    run = runs["joint"]
    rise = Samples(run.times_ns, run.power_w, run.inlet_c - run.supply_c[:, None])
    fit, _, lagged = fit_lagged(rise, 0.0, 20.0)
    err = compare(fit.d_matrix, run.hall.d_matrix, run.hall)
    expected = standard_errors(lagged, fit, run.hall)
    assert err["d_rel_frobenius"] > D_REL_BOUND
    assert expected["d_rel_frobenius"] > err["d_rel_frobenius"]
    assert expected["weak_nodes"]
