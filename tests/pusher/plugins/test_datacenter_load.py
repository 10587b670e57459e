"""The simulated hall's node powers: phase clocks, their long-run average, jitter, bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from services.pusher.plugins.datacenter_load import LoadSettings, NodeLoad, PhaseMode

N = 6
AVERAGE_W = 3500.0 - 0.25 * 800.0
"""A busy node with communication share 0.25 (between 3500 W and 2700 W phases)."""


def _load(phases: PhaseMode = "node", jitter: float = 0.0, seed: int = 1) -> NodeLoad:
    settings = LoadSettings(
        compute_w=3500.0,
        comm_w=2700.0,
        idle_w=1000.0,
        phases=phases,
        phase_period_s=2.0,
        busy_jitter=jitter,
        idle_jitter=jitter / 2,
    )
    return NodeLoad(settings, np.random.default_rng(seed))


def _trace(load: NodeLoad, seconds: float, jobs: list[str | None], busy: list[bool]) -> np.ndarray:
    avg = np.array([AVERAGE_W if b else 1000.0 for b in busy])
    mask = np.array(busy)
    return np.array([load.powers_w(t, avg, mask, jobs) for t in np.arange(0.0, seconds, 0.25)])


def test_phases_average_to_the_allocators_power() -> None:
    trace = _trace(_load(), 4000.0, ["j1"] * 4 + [None] * 2, [True] * 4 + [False] * 2)
    busy, idle = trace[:, :4], trace[:, 4:]
    assert set(np.unique(busy)) == {2700.0, 3500.0}
    assert busy.mean() == pytest.approx(AVERAGE_W, abs=15.0)
    assert (busy == 2700.0).mean() == pytest.approx(0.25, abs=0.02)
    assert (idle == 1000.0).all()


def test_node_clocks_are_independent_and_job_clocks_lock_step() -> None:
    jobs: list[str | None] = ["j1"] * N
    own = _trace(_load("node"), 600.0, jobs, [True] * N)
    corr = np.corrcoef(own.T)[np.triu_indices(N, 1)]
    assert np.abs(corr).max() < 0.2
    lock = _trace(_load("job"), 600.0, jobs, [True] * N)
    assert (lock == lock[:, :1]).all() and lock.std() > 300.0
    flat = _trace(_load("off"), 60.0, jobs, [True] * N)
    assert (flat == AVERAGE_W).all()


def test_jitter_is_a_fraction_of_the_dynamic_range() -> None:
    trace = _trace(_load("off", jitter=0.04), 2000.0, ["j1", None], [True, False])
    assert trace[:, 0].std() == pytest.approx(0.04 * 2500, rel=0.05)
    assert trace[:, 1].std() == pytest.approx(0.02 * 2500, rel=0.05)


def test_finished_jobs_release_their_clocks_and_absent_nodes_draw_nothing() -> None:
    load = _load()
    avg = np.array([AVERAGE_W, AVERAGE_W, 0.0])
    for k in range(50):
        job = f"j{k}"  # a new job every sample
        load.powers_w(k * 0.25, avg, np.array([True, True, False]), [job, job, None])
    assert len(load._phases) == 2
    out = load.powers_w(13.0, avg, np.array([True, True, False]), ["j", "j", None])
    assert out[2] == 0.0
    # After an hour's pause the clocks restart instead of replaying every phase.
    assert load.powers_w(3600.0, avg, np.array([True, True, False]), ["j", "j", None])[0] in (
        2700.0,
        3500.0,
    )


def test_a_node_that_never_communicates_stays_in_compute() -> None:
    load = _load()
    avg = np.array([3500.0])
    out = [load.powers_w(t, avg, np.array([True]), ["j"])[0] for t in np.arange(0, 100, 0.25)]
    assert set(out) == {3500.0}
