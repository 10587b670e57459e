"""The pusher service end to end: profile defaults, both wire formats, metadata, REST."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.common.errors import ConfigError
from services.pusher.settings import short_hostname
from tests.pusher.conftest import FIXTURES, Collector, make_config, running
from tests.support.servers import Mosquitto


async def test_up_profile_publishes_tester_and_procfs_as_kvb1(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    cfg = make_config(tmp_path, {}, profile="up", broker_port=mosquitto_broker.port)
    host = "/" + short_hostname()
    want = [f"{host}/tester/s0000", f"{host}/procfs/meminfo/MemFree", f"{host}/procfs/cpu0/user"]
    async with running(cfg) as svc:
        assert sorted(svc.manager.instances) == ["procfs", "tester"]
        await collector.wait_for(lambda: all(w in collector.readings for w in want))
    assert any(t.startswith("/KELVIN_BATCH/") for t in collector.topics)
    assert collector.errors == []
    ts, value = collector.readings[f"{host}/procfs/meminfo/MemFree"][0]
    assert value > 0
    assert ts % 1_000_000_000 == 0, "readings are stamped on the 1 s wall-clock grid"
    assert collector.metadata[f"{host}/procfs/meminfo/MemFree"].unit == "KiB"


async def test_dcdb_format_one_publish_per_sensor_with_scale(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    cfg = make_config(
        tmp_path,
        {
            "prefix": "/n1",
            "format": "dcdb",
            "plugins": {
                "procfs": {"root": str(FIXTURES / "proc"), "interval": 100, "files": ["stat"]},
                "tester": {"sensors": 3, "interval": 100, "factor": 2.0},
            },
        },
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg):
        await collector.wait_for(
            lambda: (
                len(collector.readings.get("/n1/procfs/cpu0/user", [])) >= 2
                and len(collector.readings.get("/n1/tester/s0002", [])) >= 2
            )
        )
    assert not any(t.startswith("/KELVIN_BATCH/") for t in collector.topics)
    assert "/n1/tester/s0000" in collector.topics
    # The fixture's cpu0 user column is 1234567 ticks; scale 1/USER_HZ makes it seconds.
    meta = collector.metadata["/n1/procfs/cpu0/user"]
    assert meta.unit == "s" and meta.monotonic
    value = collector.readings["/n1/procfs/cpu0/user"][0][1]
    assert value == pytest.approx(1234567 * meta.scale)
    tester = [v for _, v in collector.readings["/n1/tester/s0002"]]
    assert tester[:2] == [2.0, 4.0], "counter mode times factor 2"


async def test_bad_plugin_key_names_file_path_and_expectation(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, {"plugins": {"tester": {"sensors": "many"}}})
    with pytest.raises(ConfigError) as err:
        from services.pusher.app import create_service

        create_service(cfg)
    msg = str(err.value)
    assert str(tmp_path / "kelvin.yaml") in msg
    assert "pusher.plugins.tester.sensors" in msg and "an integer" in msg


async def test_rest_lists_plugins_sensors_and_cache(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    cfg = make_config(
        tmp_path,
        {"prefix": "/n2", "plugins": {"tester": {"sensors": 4, "interval": 100}}},
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg) as svc:
        await collector.wait_for(lambda: len(collector.readings.get("/n2/tester/s0003", [])) >= 3)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}") as http:
            plugins = (await http.get("/api/v1/plugins")).json()
            sensors = (await http.get("/api/v1/sensors", params={"plugin": "tester"})).json()
            cached = (await http.get("/api/v1/cache/n2/tester/s0001?average_s=10")).json()
            missing = await http.get("/api/v1/cache/n2/tester/nope")
            endless = await http.get("/api/v1/cache/n2/tester/s0001?average_s=inf")
            ready = await http.get("/readyz")
    assert [(p["name"], p["state"], p["sensors"]) for p in plugins] == [("tester", "running", 4)]
    assert sensors == [f"/n2/tester/s000{i}" for i in range(4)]
    assert cached["value"] >= 3 and cached["timestamp_ns"] % 100_000_000 == 0
    assert 1 <= cached["average"] <= cached["value"]
    assert missing.status_code == 404
    assert endless.status_code == 422 and "average_s" in endless.text
    assert ready.status_code == 200
