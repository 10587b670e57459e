"""Decisions: reported numbers, capacity waits, the reliability constraint, power by phase."""

from __future__ import annotations

import numpy as np
import pytest

from services.allocator.engine import Allocator, current
from services.allocator.model import HallModel, PowerModel
from services.allocator.state import HallState
from services.common.thermal import reference_hall


def _state() -> HallState:
    return HallState(HallModel(reference_hall()))


def test_decision_reports_consistent_numbers() -> None:
    state = _state()
    d = Allocator("joint", alternatives=3).decide(state, 6, comm_share=0.2)
    assert d.placed and d.reason == "placed" and d.choice is not None
    c = d.choice
    hall = state.model.hall
    powers = state.powers_w.copy()
    powers[c.nodes] = c.node_power_w
    tin = hall.inlet_c(powers)
    assert c.max_tin_c == pytest.approx(tin.max())
    assert c.supply_c == pytest.approx(15 + 30 - tin.max())
    assert c.cop == pytest.approx(hall.cop(c.supply_c))
    assert c.computing_kw == pytest.approx(powers.sum() / 1e3)
    assert c.cooling_kw == pytest.approx(hall.cooling_power_w(powers) / 1e3)
    assert c.cc == pytest.approx(state.model.cc(c.nodes))
    assert c.utilization == pytest.approx(6 / 40)
    assert len(d.runner_ups) == 3
    doc = d.as_dict()
    for key in ("nodes", "cc", "max_tin_c", "supply_c", "cop", "computing_kw", "cooling_kw"):
        assert key in doc
    assert len(doc["runner_ups"]) == 3


def test_busy_power_is_weighted_by_phase() -> None:
    p = PowerModel(3500.0, 2700.0)
    # C = 0.2, Lf = 2: stretch 1.2, c_eff = 0.4/1.2
    assert p.busy_w(0.2, 2.0) == pytest.approx((1 - 1 / 3) * 3500 + (1 / 3) * 2700)
    assert PowerModel(3500.0, phase_weighted=False).busy_w(0.2, 2.0) == 3500.0


def test_a_job_larger_than_the_free_nodes_waits_for_capacity() -> None:
    state = _state()
    state.place("a", np.arange(36), 3500.0)
    d = Allocator("mpit").decide(state, 5)
    assert not d.placed and d.reason == "capacity" and d.choice is None
    with pytest.raises(ValueError, match="between 1 and 40"):
        Allocator("mpit").decide(state, 41)


def test_reliability_constraint_stalls_a_hot_placement() -> None:
    state = _state()
    alone = Allocator("first-fit").decide(state, 8)
    assert alone.choice is not None
    limit = alone.choice.min_mttf_years + 0.01
    strict = Allocator("first-fit", min_mttf_years=limit).decide(state, 8)
    assert not strict.placed and strict.reason == "mttf"
    assert strict.choice is not None and strict.choice.min_mttf_years < limit
    loose = Allocator("first-fit", min_mttf_years=limit - 0.02).decide(state, 8)
    assert loose.placed


def test_place_and_release_restore_idle_power() -> None:
    state = _state()
    before = current(state).cooling_kw
    state.place("x", [1, 2, 3], 3500.0)
    assert current(state).cooling_kw > before
    state.release("x")
    assert current(state).cooling_kw == pytest.approx(before)
    with pytest.raises(ValueError, match="not free"):
        state.place("y", [4, 4], 3500.0)
