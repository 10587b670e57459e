"""opa from the fake /sys tree and recorded perfquery output (no fabric here)."""

from __future__ import annotations

from tests.pusher.conftest import FIXTURES, build_plugin, by_name


async def test_opa_port_counters_from_sysfs_in_bytes() -> None:
    _, (group,) = await build_plugin("opa", {"root": str(FIXTURES / "sys")})
    values = by_name(group, group.read(0))
    assert values["/t/opa/hfi1_0/port1/port_xmit_data"] == 4 * 1234567890
    assert values["/t/opa/hfi1_0/port1/port_rcv_packets"] == 4567890
    assert values["/t/opa/hfi1_0/port1/link_downed"] == 1
    assert {s.name: s.unit for s in group.sensors}["/t/opa/hfi1_0/port1/port_rcv_data"] == "B"
    group.close()


async def test_opa_from_perfquery_output() -> None:
    cmd = [str(FIXTURES / "opa" / "fake-perfquery"), "-x"]
    _, (group,) = await build_plugin("opa", {"command": cmd, "name": "hfi1_0_p1"})
    values = by_name(group, await group.read_async(0))
    assert values["/t/opa/hfi1_0_p1/PortXmitData"] == 4938271560
    assert "/t/opa/hfi1_0_p1/PortSelect" not in values
    assert len(values) == 8
