"""``nvml``: NVIDIA GPU power, temperature, utilisation, memory, energy and clocks.

Through NVML (``nvidia-ml-py``): one group per GPU, read in the group's worker
thread (NVML calls can take milliseconds). Sensors ``<prefix>/gpu<i>/<metric>``:
``power`` (W), ``temperature`` (°C), ``utilization_gpu`` and
``utilization_memory`` (%), ``memory_used`` (B), ``energy`` (J, monotonic) and
``sm_clock`` (MHz). A metric a GPU does not support is left out for that GPU.
A node without a GPU, driver or NVML library is a clean state, not an error:
the plugin loads with no sensors and says why in its status notes.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Callable
from typing import Any, Literal

from services.pusher.plugins.base import Group, GroupOptions, Plugin, PluginConfig, Sensor, Values

log = logging.getLogger(__name__)

Metric = Literal[
    "power",
    "temperature",
    "utilization_gpu",
    "utilization_memory",
    "memory_used",
    "energy",
    "sm_clock",
]
# metric -> (unit, monotonic, DCDB scale, reader(nvml, handle) -> physical value)
METRICS: dict[str, tuple[str, bool, float, Callable[[Any, Any], float]]] = {
    "power": ("W", False, 0.001, lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000),
    "temperature": ("°C", False, 1.0, lambda n, h: n.nvmlDeviceGetTemperature(h, 0)),
    "utilization_gpu": ("%", False, 1.0, lambda n, h: n.nvmlDeviceGetUtilizationRates(h).gpu),
    "utilization_memory": ("%", False, 1.0, lambda n, h: n.nvmlDeviceGetUtilizationRates(h).memory),
    "memory_used": ("B", False, 1.0, lambda n, h: n.nvmlDeviceGetMemoryInfo(h).used),
    "energy": ("J", True, 0.001, lambda n, h: n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000),
    "sm_clock": ("MHz", False, 1.0, lambda n, h: n.nvmlDeviceGetClockInfo(h, 1)),
}


class NvmlConfig(PluginConfig):
    metrics: list[Metric] = list(METRICS)  # type: ignore[arg-type]
    gpus: list[int] | None = None
    """GPU indices (default all)."""


class GpuGroup(Group):
    blocking = True

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        nvml: Any,
        handle: Any,
        readers: list[Callable[[Any, Any], float]],
    ) -> None:
        super().__init__(name, sensors, options)
        self.nvml = nvml
        self.handle = handle
        self.readers = readers

    def read(self, timestamp_ns: int) -> Values:
        out = array("d", bytes(8 * len(self.readers)))
        for i, reader in enumerate(self.readers):
            try:
                out[i] = reader(self.nvml, self.handle)
            except self.nvml.NVMLError:
                out[i] = float(
                    "nan"
                )  # e.g. GPU fallen off the bus: no reading, the rest still count
        return out


class NvmlPlugin(Plugin):
    """NVIDIA GPUs through NVML."""

    Config = NvmlConfig
    description = "NVIDIA GPU power, temperature, utilisation (NVML)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, NvmlConfig)
        self._nvml: Any = None
        try:
            import pynvml
        except ImportError:
            self.notes.append("no GPU monitoring: nvidia-ml-py is not installed")
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.notes.append(f"no NVIDIA GPU here: {exc}")
            log.info("nvml %s: no NVIDIA GPU here (%s)", self.context.instance, exc)
            return []
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        indices = cfg.gpus if cfg.gpus is not None else list(range(count))
        if not indices:
            self.notes.append("NVML works but reports no GPU")
        opts = self.group_options()
        groups: list[Group] = []
        for i in indices:
            if i >= count:
                self.notes.append(f"GPU {i} does not exist (NVML reports {count})")
                continue
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            sensors, readers = [], []
            for m in cfg.metrics:
                unit, monotonic, scale, reader = METRICS[m]
                try:
                    reader(pynvml, handle)
                except pynvml.NVMLError as exc:
                    self.notes.append(f"gpu{i}/{m} not supported: {exc}")
                    continue
                sensors.append(
                    self.sensor(f"gpu{i}/{m}", opts, unit, monotonic=monotonic, scale=scale)
                )
                readers.append(reader)
            if sensors:
                groups.append(GpuGroup(f"gpu{i}", sensors, opts, pynvml, handle, readers))
        return groups

    async def close(self) -> None:
        if getattr(self, "_nvml", None) is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml = None
        await super().close()
