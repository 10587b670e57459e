"""``tester``: N synthetic sensors at near-zero cost (DCDB's tester plugin).

Sensors ``<prefix>/s0000`` ... (zero-padded to the width of the largest
index). ``mode``: ``counter`` (start value + number of reads, as DCDB's tester:
one array repetition per read, whatever the number of sensors), ``sine`` (a
wave per sensor, for demos) or ``random`` (uniform in [0, 1); numpy's
generator, imported only in this mode).
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Literal

from services.common.schema import AliasChoices, Field
from services.pusher.plugins.base import Group, GroupOptions, Plugin, PluginConfig, Sensor, Values


class TesterConfig(PluginConfig):
    sensors: int = Field(
        100, ge=1, le=10_000_000, validation_alias=AliasChoices("sensors", "numSensors")
    )
    """How many sensors."""
    groups: int = Field(1, ge=1)
    """Split the sensors into this many groups (read independently)."""
    start_value: float = 0.0
    mode: Literal["counter", "sine", "random"] = "counter"
    period_s: float = Field(60.0, gt=0)
    """Period of the ``sine`` mode."""


class TesterGroup(Group):
    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        config: TesterConfig,
        first: int,
    ) -> None:
        super().__init__(name, sensors, options)
        self.mode = config.mode
        self.start = config.start_value
        self.period_ns = config.period_s * 1e9
        self.count = 0
        n = len(sensors)
        self.first = first
        self._phase = [i * (2 * math.pi / 97) for i in range(first, first + n)]
        self._rng: Any = None

    def read(self, timestamp_ns: int) -> Values:
        self.count += 1
        n = len(self.sensors)
        if self.mode == "counter":
            return array("d", [self.start + self.count]) * n
        if self.mode == "sine":
            angle = 2 * math.pi * (timestamp_ns % self.period_ns) / self.period_ns
            sin, start = math.sin, self.start
            return array("d", [start + sin(p + angle) for p in self._phase])
        if self._rng is None:  # numpy (~18 MB of RSS): only the random mode loads it
            import numpy as np

            self._rng = np.random.default_rng(self.first)
        return self.start + self._rng.random(n)  # type: ignore[no-any-return]


class TesterPlugin(Plugin):
    """N synthetic sensors."""

    Config = TesterConfig
    description = "synthetic sensors (counter, sine or random)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, TesterConfig)
        width = max(4, len(str(cfg.sensors - 1)))
        opts = self.group_options()
        groups: list[Group] = []
        per = math.ceil(cfg.sensors / cfg.groups)
        for g, first in enumerate(range(0, cfg.sensors, per)):
            last = min(cfg.sensors, first + per)
            sensors = [self.sensor(f"s{i:0{width}d}", opts) for i in range(first, last)]
            groups.append(TesterGroup(f"g{g}", sensors, opts, cfg, first))
        return groups
