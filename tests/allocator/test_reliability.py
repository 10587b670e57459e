"""Junction temperature and MTTF against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.allocator.reliability import BOLTZMANN_EV_K, ReliabilityModel


def test_mttf_is_five_years_at_60_c_with_equal_thirds() -> None:
    m = ReliabilityModel()
    assert float(m.mttf_years(60.0)) == pytest.approx(5.0)
    t_k = 60.0 + 273.15
    per_mechanism = m.lambda0_per_year * np.exp(
        -np.array([0.7, 0.75, 0.6]) / (BOLTZMANN_EV_K * t_k)
    )
    np.testing.assert_allclose(per_mechanism, [1 / 15] * 3)


def test_mttf_at_70_c_by_hand() -> None:
    t60, t70 = 333.15, 343.15
    rate = sum(
        (1 / 15) * math.exp(ea / 8.617e-5 * (1 / t60 - 1 / t70)) for ea in (0.7, 0.75, 0.15 / 0.25)
    )
    assert float(ReliabilityModel().mttf_years(70.0)) == pytest.approx(1 / rate)
    assert 2.0 < 1 / rate < 2.6  # roughly halves per 10 K


def test_junction_temperature_by_hand() -> None:
    m = ReliabilityModel()
    # T_HS = 45 + (25 - 15) 0.6 = 51; active: + 120 W x 0.1 = 63; idle: + 34.29 x 0.1
    np.testing.assert_allclose(m.junction_c([25.0, 25.0], [True, False]), [63.0, 51.0 + 12 / 3.5])
    assert m.min_mttf_years([15.0, 25.0], [True, True]) == pytest.approx(float(m.mttf_years(63.0)))


def test_reliability_decays_with_time() -> None:
    m = ReliabilityModel()
    assert float(m.reliability(5.0, 60.0)) == pytest.approx(math.exp(-1.0))
    assert float(m.reliability(0.0, 90.0)) == 1.0
