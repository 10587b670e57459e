"""sysfs against a checked-in fake /sys tree (copied, so counters can move)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import ConfigError
from tests.pusher.conftest import FIXTURES, build_plugin, by_name


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sys", root)
    return root


async def test_discovers_hwmon_thermal_and_rapl_with_units(sys_root: Path) -> None:
    _, groups = await build_plugin("sysfs", {"root": str(sys_root)})
    by_group = {g.name: g for g in groups}
    assert sorted(by_group) == ["hwmon", "rapl", "thermal"]
    hw = by_name(by_group["hwmon"], by_group["hwmon"].read(0))
    assert hw == {
        "/t/sysfs/hwmon/coretemp/Package_id_0": 45.0,
        "/t/sysfs/hwmon/coretemp/Core_0": 43.0,
        "/t/sysfs/hwmon/coretemp/Core_1": 44.5,
        "/t/sysfs/hwmon/nvme/Composite": 38.85,
        "/t/sysfs/hwmon/coretemp1/Package_id_1": 47.0,
        "/t/sysfs/hwmon/nct6775/temp1": 31.0,
    }
    th = by_name(by_group["thermal"], by_group["thermal"].read(0))
    assert th == {"/t/sysfs/thermal/x86_pkg_temp": 46.0, "/t/sysfs/thermal/acpitz": 27.8}
    meta = by_group["hwmon"].sensors[0].metadata(1000)
    assert meta.unit == "°C" and meta.scale == 0.001
    rapl = by_group["rapl"]
    assert [s.name for s in rapl.sensors] == [
        "/t/sysfs/rapl/package-0/energy",
        "/t/sysfs/rapl/package-0/core/energy",
        "/t/sysfs/rapl/package-0/dram/energy",
    ]
    assert rapl.read(0)[0] == pytest.approx(123456.789012)
    m = rapl.sensors[0].metadata(1000)
    assert m.unit == "J" and m.monotonic and m.scale == 1e-6
    assert rapl.sensors[2].options.delta_max == pytest.approx(65712.999613)
    for g in groups:
        g.close()


async def test_rapl_counter_is_re_read_and_delta_handles_the_wrap(sys_root: Path) -> None:
    from services.pusher.processing import Processor

    _, groups = await build_plugin(
        "sysfs", {"root": str(sys_root), "hwmon": False, "thermal": False, "delta": True}
    )
    (rapl,) = groups
    proc = Processor([s.options for s in rapl.sensors])
    dram = sys_root / "class/powercap/intel-rapl:0:1/energy_uj"
    sent = []
    for uj in (65712999000, 65712999613, 1000):  # the last one wrapped past the range
        dram.write_text(f"{uj}\n")
        out = proc.process(rapl.read(0))
        sent.append(None if out.send_mask is not None and not out.send_mask[2] else out.send[2])
    assert sent[0] is None, "the first reading of a delta sensor is dropped"
    assert sent[1] == pytest.approx(613e-6)
    assert sent[2] == pytest.approx(1000e-6)  # 0.001 J after the wrap, not a negative amount
    rapl.close()


async def test_configured_files_with_regex_and_missing_values(sys_root: Path) -> None:
    (sys_root / "custom").mkdir()
    (sys_root / "custom" / "status").write_text("state=ok load=0.75 fans=3\n")
    section = {
        "root": str(sys_root),
        "hwmon": False,
        "thermal": False,
        "rapl": False,
        "groups": [
            {
                "name": "board",
                "interval": 500,
                "sensors": [
                    {"name": "fan1", "path": "class/hwmon/hwmon3/fan1_input", "unit": "rpm"},
                    {"name": "load", "path": "custom/status", "regex": r"load=([0-9.]+)"},
                    {"name": "nope", "path": "custom/status", "regex": r"volts=([0-9.]+)"},
                ],
            }
        ],
    }
    _, (group,) = await build_plugin("sysfs", section)
    values = group.read(0)
    assert values[:2].tolist() == [1320.0, 0.75] and np.isnan(values[2])
    assert group.options.interval_ms == 500
    (sys_root / "custom" / "status").write_text("garbage\n")
    assert np.isnan(group.read(0)[1]), "an unparsable value is no reading, not an error"
    group.close()  # drops the open descriptors; the next read opens the files again
    (sys_root / "custom" / "status").unlink()
    assert np.isnan(group.read(0)[1]), "a vanished file is no reading, not an error"
    assert group.read(0)[0] == 1320.0
    group.close()


async def test_missing_file_and_bad_regex_are_config_errors(sys_root: Path) -> None:
    bad_path = {
        "root": str(sys_root),
        "groups": [{"name": "g", "sensors": [{"name": "x", "path": "nope"}]}],
    }
    with pytest.raises(ConfigError, match="does not exist"):
        await build_plugin("sysfs", bad_path)
    bad_rx = {
        "groups": [{"name": "g", "sensors": [{"name": "x", "path": "a", "regex": "no group"}]}]
    }
    with pytest.raises(ConfigError, match=r"pusher\.plugins\.sysfs\.groups\.0\.sensors\.0\.regex"):
        await build_plugin("sysfs", bad_rx)
