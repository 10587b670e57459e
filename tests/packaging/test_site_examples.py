"""The files docs/monitor-your-nodes.md ships work as written: the systemd units, the node's
and the management server's configuration, the 200-node hall file and its sensor map."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from services.allocator.closed_loop import sensor_names
from services.allocator.settings import Settings as AllocatorSettings
from services.cli import build_parser
from services.collect_agent.settings import Settings as AgentSettings
from services.common.halls.hallfile import load_hall
from services.common.settings import Config
from services.pusher.config import plugin_sections, validate_section
from services.pusher.settings import Settings as PusherSettings
from services.query_api.settings import Settings as QuerySettings

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "examples" / "site"
UNITS = sorted((ROOT / "examples" / "systemd").glob("*.service"))


def _exec_start(unit: Path) -> list[str]:
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.split("=", 1)[1])


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_the_units_start_a_real_kelvin_command(unit: Path, tmp_path: Path) -> None:
    argv = _exec_start(unit)
    assert argv[0] == "/opt/kelvin/bin/kelvin"
    args = build_parser(tools=False).parse_args(argv[1:])  # SystemExit on a bad flag
    assert args.command in ("run", "up")
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing (package systemd)")
        pytest.skip("systemd-analyze is not installed")
    # The unit as installed, with this checkout's kelvin where /opt/kelvin's would be.
    local = tmp_path / unit.name
    local.write_text(
        unit.read_text().replace(
            "/opt/kelvin/bin/kelvin", str(Path(sys.executable).parent / "kelvin")
        )
    )
    r = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_node_and_server_configurations_validate(tmp_path: Path) -> None:
    node = Config(SITE / "pusher.yaml")
    settings = node.load(PusherSettings)
    assert settings.brokers == ["mgmt01:1883"]
    for name, section in plugin_sections(settings.plugins, "run").items():
        validate_section(name, section, "pusher.yaml")
    allocator = subprocess.run(
        [sys.executable, str(SITE / "allocator-section.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    server_file = tmp_path / "kelvin.yaml"
    server_file.write_text((SITE / "kelvin.yaml").read_text() + allocator)
    server = Config(server_file)
    assert server.load(AgentSettings).mqtt_users == {"pusher": settings.mqtt_password}
    assert "/hall/power" in server.load(QuerySettings).virtual_sensors
    pusher = server.load(PusherSettings)
    for name, section in plugin_sections(pusher.plugins, "up").items():
        validate_section(name, section, "kelvin.yaml")
    alloc = server.load(AllocatorSettings)
    assert str(alloc.hall_file) == "/etc/kelvin/hall.yaml"
    # The hall file with its D still unknown (zeros, as the guide writes it), and the map.
    shutil.copy(SITE / "hall.yaml", tmp_path / "hall.yaml")
    np.savetxt(tmp_path / "hall-a.D.txt", np.zeros((200, 200)), fmt="%g")
    hall = load_hall(tmp_path / "hall.yaml")
    assert (hall.rows, hall.racks, hall.slots, hall.n_nodes) == (4, 10, 5, 200)
    names = sensor_names(hall, alloc.sensor_map)
    assert len(names["power"]) == len(names["inlet_temp"]) == 200
    assert names["inlet_temp"][0] == "/cn001/ipmi/local/Inlet_Temp"
    assert names["power"][199] == "/cn200/ipmi/local/PS1_Input_Power"
