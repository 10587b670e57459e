"""The collect agent stores its own rates as sensors, through its spool like any reading."""

from __future__ import annotations

import asyncio

import pytest

from services.collect_agent import self_sensors
from tests.collect_agent.conftest import AgentFactory


async def test_own_rates_are_stored_with_their_units(make_agent: AgentFactory) -> None:
    agent = await make_agent(self_sensors_s=0.2, self_sensors_prefix="/kelvin/collect_agent/a1")
    storage = agent.storage
    assert storage is not None
    name = "/kelvin/collect_agent/a1/readings_per_s"
    for _ in range(100):  # stored within a few rounds of 0.2 s; nothing to await
        series = await storage.read(name, 0, 2**62)
        if len(series) and await storage.get_metadata(name):
            break
        await asyncio.sleep(0.1)
    assert len(series) >= 1
    meta = await storage.get_metadata(name)
    assert meta is not None and meta.unit == "1/s"
    pending = await storage.read("/kelvin/collect_agent/a1/spool_pending_readings", 0, 2**62)
    assert len(pending) >= 1 and pending.values[0] >= 0
    assert "self" in {
        s.labels["transport"] for m in agent.metrics.messages.collect() for s in m.samples
    }


@pytest.mark.parametrize(
    ("configured", "profile", "expected"),
    [
        (None, "up", 5.0),
        (None, "demo", 5.0),
        (None, "run", 0.0),
        (2.0, "run", 2.0),
        (0.0, "up", 0.0),
    ],
)
def test_on_under_kelvin_up_off_under_run_unless_configured(
    configured: float | None, profile: str, expected: float
) -> None:
    assert self_sensors.interval_s(configured, profile) == expected
