"""nvml: real NVML where a GPU exists; elsewhere the clean "no GPU" state is what is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pusher.conftest import Collector, build_plugin, make_config, running
from tests.support.servers import Mosquitto


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return n
    except Exception:
        return 0


async def test_without_a_gpu_the_plugin_loads_with_no_sensors_and_says_why(
    tmp_path: Path, mosquitto_broker: Mosquitto, collector: Collector
) -> None:
    if _gpu_count():
        pytest.skip("this machine has an NVIDIA GPU; the no-GPU state cannot be observed")
    cfg = make_config(
        tmp_path,
        {"prefix": "/g", "plugins": {"nvml": {}, "tester": {"sensors": 1, "interval": 100}}},
        broker_port=mosquitto_broker.port,
    )
    async with running(cfg) as svc:
        await collector.wait_for(lambda: "/g/tester/s0000" in collector.readings)
        status = svc.manager.get("nvml").status()
    assert status["state"] == "running" and status["sensors"] == 0 and status["error"] is None
    assert status["notes"] and "no" in status["notes"][0].lower()
    assert not any(k.startswith("/g/nvml") for k in collector.readings)


async def test_reads_every_gpu_where_there_is_one() -> None:
    if not _gpu_count():
        pytest.skip("no NVIDIA GPU (or driver) on this machine")
    plugin, groups = await build_plugin(
        "nvml", {"metrics": ["power", "temperature", "utilization_gpu"]}
    )
    assert groups and all(g.name.startswith("gpu") for g in groups)
    values = groups[0].read(0)
    assert 0 < values[0] < 2000 and 0 < values[1] < 120
    await plugin.close()
