"""ipmi through a stand-in ipmitool that prints recorded output (no BMC on test machines)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path

import pytest

from services.common.errors import KelvinError
from tests.pusher.conftest import FIXTURES, build_plugin, by_name

FAKE = str(FIXTURES / "ipmi" / "fake-ipmitool")


@pytest.fixture
def ipmi_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "ipmitool.log"
    monkeypatch.setenv("FAKE_IPMITOOL_LOG", str(log))
    return log


async def test_discovers_threshold_sensors_per_host_with_units(ipmi_log: Path) -> None:
    section = {
        "ipmitool": FAKE,
        "hosts": [
            {"name": "local"},
            {"name": "n17", "host": "10.0.0.17", "username": "admin", "password": "s3cret"},
        ],
    }
    plugin, (local, n17) = await build_plugin("ipmi", section)
    calls = _text(ipmi_log).splitlines()
    assert calls[0] == "sensor password="
    assert calls[1] == "-I lanplus -H 10.0.0.17 -N 1 -R 1 -U admin -E sensor password=set"
    assert "s3cret" not in _text(ipmi_log), "the password never appears in argv"
    values = by_name(n17, await n17.read_async(0))
    assert values["/t/ipmi/n17/CPU1_Temp"] == 45.0
    assert values["/t/ipmi/n17/PS1_Input_Power"] == 312.0
    assert "/t/ipmi/n17/FAN3" not in values, "no reading now: not discovered"
    assert not any("Status" in k or "Intru" in k for k in values), "discrete sensors skipped"
    units = {s.name.rsplit("/", 1)[1]: s.unit for s in n17.sensors}
    assert units["CPU1_Temp"] == "°C" and units["FAN1"] == "rpm" and units["12V"] == "V"
    assert units["PS1_Input_Power"] == "W" and units["PS1_Curr_Out"] == "%"
    assert n17.options.interval_ms == 10_000, "IPMI defaults to 10 s"
    assert len(local.sensors) == len(n17.sensors) == 10
    await plugin.close()


async def test_configured_sensor_without_reading_is_nan(ipmi_log: Path) -> None:
    section = {"ipmitool": FAKE, "hosts": [{"name": "h", "sensors": ["FAN3", "Inlet Temp"]}]}
    _, (group,) = await build_plugin("ipmi", section)
    values = await group.read_async(0)
    assert math.isnan(values[0]) and values[1] == 23.0


async def test_unreachable_host_is_skipped_and_named(ipmi_log: Path) -> None:
    section = {
        "ipmitool": FAKE,
        "hosts": [{"name": "down", "host": "unreachable"}, {"name": "up", "host": "10.0.0.2"}],
    }
    plugin, groups = await build_plugin("ipmi", section)
    assert [g.name for g in groups] == ["up"]
    assert plugin.notes == [
        "host down skipped: fake-ipmitool exited with 1: "
        "Error: Unable to establish IPMI v2 / RMCP+ session"
    ]
    with pytest.raises(KelvinError, match="no BMC answered"):
        await build_plugin(
            "ipmi", {"ipmitool": FAKE, "hosts": [{"name": "d", "host": "unreachable"}]}
        )


async def test_a_hanging_ipmitool_is_killed_at_the_timeout(
    ipmi_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = {"ipmitool": FAKE, "hosts": [{"name": "slow", "sensors": ["FAN1"]}]}
    _, (group,) = await build_plugin("ipmi", section)
    monkeypatch.setenv("FAKE_IPMITOOL_SLEEP", "30")
    # The runner applies the group's timeout exactly like this (see test_sampling).
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(group.read_async(0), 0.3)
    assert _running(f"{FAKE}\x00sensor") == [], "the timed-out ipmitool was killed"


def _text(p: Path) -> str:
    return p.read_text()


def _running(cmdline_end: str) -> list[Path]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (p / "cmdline").read_text().rstrip("\x00").endswith(cmdline_end):
                found.append(p)
    return found
