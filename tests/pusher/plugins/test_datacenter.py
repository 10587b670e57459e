"""datacenter against a real local HTTP server that answers like the allocator's /api/v1/hall."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.common.hall_physics import lagged
from services.common.thermal import node_sensor, reference_hall
from services.pusher.config import validate_section
from services.pusher.plugins.base import PluginContext, SensorOptions
from services.pusher.plugins.datacenter import DatacenterPlugin
from services.pusher.plugins.datacenter_ledger import sensors as _ledger_sensors
from tests.pusher.conftest import (
    Collector,
    JsonServer,
    build_plugin,
    by_name,
    make_config,
    running,
)
from tests.support.servers import Mosquitto

HALL = reference_hall()


def ledger_sensors(prefix: str) -> list[Any]:
    return _ledger_sensors(prefix, SensorOptions())


STEADY = {"phases": "off", "busy_jitter": 0, "idle_jitter": 0, "ledger": False}
"""Every node draws the allocator's average power: the thermal model alone."""


def hall_doc(busy: set[int], power_w: dict[int, float]) -> dict[str, Any]:
    nodes = []
    for i in range(HALL.n_nodes):
        r, k, s = HALL.position(i)
        nodes.append(
            {
                "index": i, "row": r, "rack": k, "slot": s,
                "busy": i in busy, "job": "j1" if i in busy else None,
                "power_w": power_w.get(i), "predicted_tin_c": 20.0,
            }
        )  # fmt: skip
    return {"name": "reference-40", "rows": 2, "racks": 5, "slots": 4, "nodes": nodes, "totals": {}}


@pytest.fixture
def allocator() -> Iterator[JsonServer]:
    server = JsonServer("/api/v1/hall")
    try:
        yield server
    finally:
        server.close()


async def test_powers_and_inlets_follow_the_placement(allocator: JsonServer) -> None:
    allocator.doc = hall_doc(busy={0, 1, 2}, power_w={2: 2100.0})
    section = {"allocator_url": allocator.url, "noise_power_w": 0, "noise_temp_c": 0, **STEADY}
    errors: list[str] = []
    plugin, (group,) = await build_plugin("datacenter", section)
    plugin.context.count_error = errors.append
    values = by_name(group, await group.read_async(0))
    expected_p = HALL.powers_w(np.isin(np.arange(HALL.n_nodes), [0, 1]))
    expected_p[2] = 2100.0
    # The first sample finds the hall in steady state at the design supply (15 °C).
    expected_t = HALL.inlet_c(expected_p)
    for i in range(HALL.n_nodes):
        assert values[node_sensor(HALL, i, "power")] == pytest.approx(expected_p[i])
        assert values[node_sensor(HALL, i, "inlet_temp")] == pytest.approx(expected_t[i])
        assert values[node_sensor(HALL, i, "outlet_temp")] == pytest.approx(
            expected_t[i] + expected_p[i] / 293.49, abs=1e-3
        )  # each node's own heat on top: 11.9 K at 3500 W
    assert values["/hall/power"] == pytest.approx(expected_p.sum())
    assert values["/hall/supply_temp"] == HALL.supply_c
    assert values["/hall/cooling_power"] == pytest.approx(expected_p.sum() / HALL.cop(15.0))
    assert values["/hall/row0/rack0/node0/power"] == HALL.busy_power_w
    units = {s.name: s.unit for s in group.sensors}
    assert units["/hall/row1/rack4/node3/power"] == "W"
    assert units["/hall/row1/rack4/node3/inlet_temp"] == "°C"
    assert units["/hall/supply_temp"] == "°C"
    # The allocator goes away: the last placement stays, the error is counted.
    allocator.close()
    again = by_name(group, await group.read_async(0))
    assert again == values
    assert errors == ["allocator_unreachable"]
    assert plugin.notes and "last known placement" in plugin.notes[0]
    await plugin.close()


async def test_noise_and_a_mismatched_hall(allocator: JsonServer) -> None:
    doc = hall_doc(busy=set(), power_w={})
    allocator.doc = {**doc, "nodes": doc["nodes"][:20]}
    errors: list[str] = []
    section = {"allocator_url": allocator.url, "seed": 7, **STEADY}
    plugin, (group,) = await build_plugin("datacenter", section)
    plugin.context.count_error = errors.append
    values = await group.read_async(0)
    n = HALL.n_nodes
    powers, inlets = values[:n], values[n : 2 * n]
    assert len(values) == 3 * n + 3  # power, inlet, outlet per node; three totals
    assert errors == ["hall_mismatch"] and "has 20 nodes" in plugin.notes[0]
    assert 0 < np.abs(powers - HALL.idle_power_w).max() < 60, "10 W noise around idle"
    assert np.abs(inlets - HALL.inlet_c(np.full(n, HALL.idle_power_w))).max() < 0.6
    await plugin.close()


async def test_every_sample_is_a_new_power_vector_and_its_own_inlets(
    allocator: JsonServer,
) -> None:
    """Phases and jitter move the powers between samples; the inlets follow the same powers."""
    allocator.doc = hall_doc(busy=set(range(8)), power_w=dict.fromkeys(range(8), 3340.0))
    section = {"allocator_url": allocator.url, "noise_power_w": 0, "noise_temp_c": 0, "seed": 3}
    section["ledger"] = False
    plugin, (group,) = await build_plugin("datacenter", section)
    assert group.options.interval_ms == 250
    n = HALL.n_nodes
    rows = [await group.read_async(k * 250_000_000) for k in range(400)]
    powers = np.array([r[:n] for r in rows])
    inlets = np.array([r[n : 2 * n] for r in rows])
    supply = np.array([r[-1] for r in rows])
    # Tin = Tsup + D·Q, Q the published powers through the hall's 20 s lag (no noise here).
    times = np.arange(400, dtype=np.int64) * 250_000_000
    heat = lagged(times, powers, 20.0)
    np.testing.assert_allclose(inlets, supply[:, None] + heat @ HALL.d_matrix.T, atol=1e-9)
    busy, idle = powers[:, :8], powers[:, 8:]
    # 3340 W average = a communication share of 0.2 between 3500 W and 2700 W phases.
    assert busy.mean() == pytest.approx(3340.0, abs=40.0)
    assert busy.std() > 300.0  # the phases, plus 125 W jitter
    assert idle.mean() == pytest.approx(HALL.idle_power_w, abs=10.0)
    assert idle.std() == pytest.approx(0.02 * 2500, rel=0.1)
    # Busy nodes of one job are not in lock-step (phases: node, the default).
    corr = np.corrcoef(busy.T)[np.triu_indices(8, 1)]
    assert np.abs(corr).max() < 0.3
    assert np.linalg.matrix_rank(powers[:60]) == 40  # a minute's worth: full rank at once
    await plugin.close()


async def test_demo_profile_publishes_the_hall(
    tmp_path: Path,
    mosquitto_broker: Mosquitto,
    collector: Collector,
    allocator: JsonServer,
) -> None:
    allocator.doc = hall_doc(busy={5}, power_w={})
    cfg = make_config(
        tmp_path,
        {"allocator_url": allocator.url},
        profile="demo",
        broker_port=mosquitto_broker.port,
    )
    name = node_sensor(HALL, 5, "power")
    async with running(cfg) as svc:
        assert sorted(svc.manager.instances) == ["datacenter", "procfs"]
        await collector.wait_for(lambda: name in collector.readings)
    # busy at the hall's busy power, give or take 5 standard deviations of the 125 W jitter
    assert collector.readings[name][0][1] == pytest.approx(HALL.busy_power_w, abs=625)
    assert collector.metadata[name].unit == "W"
    assert collector.metadata[node_sensor(HALL, 5, "inlet_temp")].unit == "°C"


async def test_the_hall_has_thermal_mass_and_a_rate_limited_crac(allocator: JsonServer) -> None:
    """Half the hall starts a job: heat, inlets and cooling follow over tens of seconds, not at
    once; the CRAC lowers its supply at no more than its rate to keep the redline."""
    allocator.doc = hall_doc(busy=set(), power_w={})
    section = {"allocator_url": allocator.url, "noise_power_w": 0, "noise_temp_c": 0, **STEADY}
    plugin, (group,) = await build_plugin("datacenter", section)
    n, step_ns = HALL.n_nodes, 250_000_000
    idle = by_name(group, await group.read_async(0))
    # An idle hall is cool: the CRAC warms its supply towards redline - margin, at 3 °C/min.
    assert idle["/hall/supply_temp"] == HALL.supply_c
    allocator.doc = hall_doc(busy=set(range(20, 40)), power_w={})
    rows = [await group.read_async(k * step_ns) for k in range(1, 4 * 120)]
    t_s = np.arange(1, 4 * 120) * 0.25
    supply = np.array([r[-1] for r in rows])
    cooling_kw = np.array([r[-2] for r in rows]) / 1e3
    hottest = np.array([r[n : 2 * n].max() for r in rows])
    assert np.abs(np.diff(supply)).max() <= 3.0 / 60 * 0.25 + 1e-9
    assert np.abs(np.diff(cooling_kw)).max() / 0.25 < 2.0  # kW/s: smooth, no jumps
    # The electrical power jumps at once; the inlets take the lag: after 20 s (one time
    # constant) the hottest inlet's rise has gone 63 % of the way, after 100 s all of it.
    rise = hottest - supply
    final = HALL.d_matrix @ HALL.powers_w(np.arange(n) >= 20)
    start = HALL.d_matrix @ HALL.powers_w(np.zeros(n))
    at = {s: rise[int(s * 4) - 1] for s in (20, 100)}
    assert at[20] == pytest.approx(start.max() + 0.632 * (final.max() - start.max()), abs=0.6)
    assert at[100] == pytest.approx(final.max(), abs=0.1)
    # The controller brought the supply down towards redline - 2.5 - rise, but a full row 1 needs
    # more than the CRAC's lowest 12 °C: the hottest inlet ends over the redline (the hall view
    # marks it), at 12 °C + the rise.
    assert HALL.redline_c - 2.5 - final.max() < 12.0
    assert supply[-1] == pytest.approx(12.0, abs=0.01)
    assert hottest[-1] == pytest.approx(12.0 + final.max(), abs=0.05) and hottest[-1] > 30
    assert t_s[np.argmax(supply <= 12.5)] > 20  # it took the CRAC a while to get there
    await plugin.close()


async def test_the_ledger_books_each_policy_and_keeps_its_totals(
    allocator: JsonServer, tmp_path: Path
) -> None:
    """Two runs with different policies: each policy's energy, cooling and time over the
    redline add up, and a restart (same state directory) carries on from the saved totals."""
    section = {"allocator_url": allocator.url, "noise_power_w": 0, "noise_temp_c": 0, **STEADY}
    section["ledger"] = True

    async def run(policy: str, busy: set[int], seconds: int) -> tuple[Any, list[Any]]:
        allocator.doc = {**hall_doc(busy=busy, power_w={}), "policy": policy}
        _, cfg = validate_section("datacenter", section, "test")
        ctx = PluginContext("datacenter", "/t/datacenter", "/t", tmp_path, allocator.url)
        plugin = DatacenterPlugin(cfg, ctx)
        hall_group, books = await plugin.build()
        rows = [await hall_group.read_async(k * 250_000_000) for k in range(4 * seconds + 1)]
        values = by_name(books, books.read(0))
        await plugin.close()
        return values, rows

    first, rows = await run("joint", set(), 10)
    it_kwh = HALL.powers_w(np.zeros(40)).sum() * 10 / 3.6e6
    assert first["/hall/policy/joint/it_energy"] == pytest.approx(it_kwh)
    cooling = np.array([r[-2] for r in rows[1:]])  # W, each held 250 ms
    assert first["/hall/policy/joint/cooling_energy"] == pytest.approx(cooling.sum() * 0.25 / 3.6e6)
    assert first["/hall/policy/joint/run_time"] == pytest.approx(10.0)
    assert first["/hall/policy/random/run_time"] == 0.0
    # row 1 fully busy: more than the CRAC can keep under the redline once the heat is up
    second, rows = await run("random", set(range(20, 40)), 120)
    assert second["/hall/policy/joint/it_energy"] == pytest.approx(it_kwh)  # kept from run 1
    assert second["/hall/policy/random/run_time"] == pytest.approx(120.0)
    over = np.array([(r[40:80] > HALL.redline_c).sum() for r in rows[1:]]) * 0.25
    assert second["/hall/policy/random/over_redline"] == pytest.approx(over.sum(), abs=1.0)
    assert second["/hall/policy/random/over_redline"] > 0
    units = {s.name: s.unit for s in ledger_sensors("/hall")}
    assert units["/hall/policy/mpit/cooling_energy"] == "kWh"
    assert units["/hall/policy/mpit/over_redline"] == "s"
