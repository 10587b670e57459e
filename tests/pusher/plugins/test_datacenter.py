"""datacenter against a real local HTTP server that answers like the allocator's /api/v1/hall."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.common.thermal import node_sensor, reference_hall
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
    section = {"allocator_url": allocator.url, "noise_power_w": 0, "noise_temp_c": 0}
    errors: list[str] = []
    plugin, (group,) = await build_plugin("datacenter", section)
    plugin.context.count_error = errors.append
    values = by_name(group, await group.read_async(0))
    expected_p = HALL.powers_w(np.isin(np.arange(HALL.n_nodes), [0, 1]))
    expected_p[2] = 2100.0
    expected_t = HALL.inlet_c(expected_p)
    for i in range(HALL.n_nodes):
        assert values[node_sensor(HALL, i, "power")] == pytest.approx(expected_p[i])
        assert values[node_sensor(HALL, i, "inlet_temp")] == pytest.approx(expected_t[i])
    assert values["/hall/power"] == pytest.approx(expected_p.sum())
    assert values["/hall/cooling_power"] == pytest.approx(HALL.cooling_power_w(expected_p))
    assert values["/hall/row0/rack0/node0/power"] == HALL.busy_power_w
    units = {s.name: s.unit for s in group.sensors}
    assert units["/hall/row1/rack4/node3/power"] == "W"
    assert units["/hall/row1/rack4/node3/inlet_temp"] == "°C"
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
    plugin, (group,) = await build_plugin("datacenter", {"allocator_url": allocator.url, "seed": 7})
    plugin.context.count_error = errors.append
    values = await group.read_async(0)
    n = HALL.n_nodes
    powers, inlets = values[:n], values[n : 2 * n]
    assert errors == ["hall_mismatch"] and "has 20 nodes" in plugin.notes[0]
    assert 0 < np.abs(powers - HALL.idle_power_w).max() < 60, "10 W noise around idle"
    assert np.abs(inlets - HALL.inlet_c(np.full(n, HALL.idle_power_w))).max() < 0.6
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
    assert collector.readings[name][0][1] == pytest.approx(HALL.busy_power_w, abs=80)
    assert collector.metadata[name].unit == "W"
    assert collector.metadata[node_sensor(HALL, 5, "inlet_temp")].unit == "°C"
