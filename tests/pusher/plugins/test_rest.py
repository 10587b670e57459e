"""rest against a real prometheus-node-exporter and a real local HTTP server serving JSON."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from services.common.errors import ConfigError, KelvinError
from tests.pusher.conftest import JsonServer, build_plugin, by_name
from tests.support.servers import free_port, require_binary, wait_port


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_binary("prometheus-node-exporter", "prometheus-node-exporter")
    port = free_port()
    log = tmp_path_factory.mktemp("node-exporter") / "log"
    proc = subprocess.Popen(
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults",
            "--collector.loadavg",
            "--collector.time",
            "--collector.stat",
            "--collector.meminfo",
        ],
        stdout=open(log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def json_server() -> Iterator[JsonServer]:
    server = JsonServer()
    try:
        yield server
    finally:
        server.close()


async def test_node_exporter_becomes_a_source(node_exporter: str) -> None:
    section = {
        "endpoints": [
            {
                "name": "node",
                "url": node_exporter,
                "format": "prometheus",
                "include": [
                    "node_load.*",
                    "node_time_seconds",
                    "node_context_switches_total",
                    "node_memory_.*",
                ],
                "exclude": ["node_load15"],
            }
        ]
    }
    plugin, (group,) = await build_plugin("rest", section)
    names = {s.name: s for s in group.sensors}
    assert "/t/rest/node/node_load1" in names and "/t/rest/node/node_load15" not in names
    assert names["/t/rest/node/node_time_seconds"].unit == "s"
    assert names["/t/rest/node/node_memory_MemFree_bytes"].unit == "B"
    assert names["/t/rest/node/node_context_switches_total"].monotonic
    assert not names["/t/rest/node/node_load1"].monotonic
    first = by_name(group, await group.read_async(0))
    second = by_name(group, await group.read_async(0))
    assert second["/t/rest/node/node_time_seconds"] >= first["/t/rest/node/node_time_seconds"] > 1e9
    assert first["/t/rest/node/node_memory_MemTotal_bytes"] > 0
    assert not np.isnan(list(second.values())).any()
    await plugin.close()


async def test_labels_become_name_levels(node_exporter: str) -> None:
    section = {
        "endpoints": [
            {
                "name": "node",
                "url": node_exporter,
                "format": "prometheus",
                "include": ["node_scrape_collector_success"],
            }
        ]
    }
    plugin, (group,) = await build_plugin("rest", section)
    assert "/t/rest/node/node_scrape_collector_success/collector=loadavg" in [
        s.name for s in group.sensors
    ]
    assert set((await group.read_async(0)).tolist()) == {1.0}
    await plugin.close()


async def test_json_paths_numbers_strings_and_missing(json_server: JsonServer) -> None:
    json_server.doc = {
        "hall": {"racks": [{"inlet": 21.5}, {"inlet": "22.75"}], "odd.key": True},
        "status": "ok",
    }
    section = {
        "endpoints": [
            {
                "name": "crac",
                "url": json_server.url + "/status",
                "sensors": [
                    {"name": "rack0/inlet", "path": "hall.racks[0].inlet", "unit": "°C"},
                    {"name": "rack1/inlet", "path": "$.hall.racks[1].inlet"},
                    {"name": "flag", "path": 'hall["odd.key"]'},
                    {"name": "text", "path": "status"},
                    {"name": "gone", "path": "hall.racks[7].inlet"},
                ],
            }
        ]
    }
    plugin, (group,) = await build_plugin("rest", section)
    values = (await group.read_async(0)).tolist()
    assert values[:3] == [21.5, 22.75, 1.0] and np.isnan(values[3]) and np.isnan(values[4])
    assert group.sensors[0].unit == "°C"
    json_server.status = 503
    with pytest.raises(KelvinError, match="HTTP 503"):
        await group.read_async(0)
    await plugin.close()


async def test_unreachable_endpoint_fails_the_read() -> None:
    url = f"http://127.0.0.1:{free_port()}/x"
    plugin, (group,) = await build_plugin(
        "rest", {"endpoints": [{"name": "e", "url": url, "sensors": [{"name": "a", "path": "a"}]}]}
    )
    with pytest.raises(KelvinError, match="ConnectError"):
        await group.read_async(0)
    await plugin.close()


async def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"endpoints\.0\.sensors\.0\.path"):
        await build_plugin(
            "rest",
            {
                "endpoints": [
                    {"name": "e", "url": "http://h/", "sensors": [{"name": "a", "path": "a..b"}]}
                ]
            },
        )
    with pytest.raises(ConfigError, match=r"endpoints\.0\.url: expected a string"):
        await build_plugin("rest", {"endpoints": [{"name": "e", "url": "ftp://h/"}]})
