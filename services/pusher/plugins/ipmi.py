"""``ipmi``: BMC sensors per host (one entity per BMC), through ``ipmitool`` or pyghmi.

With ``ipmitool`` (default) every read runs ``ipmitool [-I lanplus -H host -U
user -E] sensor`` as an asyncio subprocess (:mod:`.text`), killed when the read times out;
the password goes through the environment (``-E``), never the command line.
With ``pyghmi`` (pure Python, RMCP+) reads run in the group's worker thread.
Threshold sensors become ``<prefix>/<host name>/<sensor>`` with their unit
(``degrees C`` -> ``°C``, ``Watts`` -> ``W``, ...); discrete sensors are skipped.
Without a ``sensors`` list the host is asked once at load time which it has;
a host that does not answer then is skipped and named in the plugin's status.
"""

from __future__ import annotations

import asyncio
import logging
import re
from array import array
from typing import Literal

from services.common.errors import KelvinError
from services.common.schema import Field
from services.common.tasks import wait_for
from services.pusher.plugins.base import (
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    PluginContext,
    Sensor,
    Values,
    interval_field,
)
from services.pusher.plugins.text import ParsedGroup, TextSource

log = logging.getLogger(__name__)

UNITS = {
    "degrees C": "°C",
    "degrees F": "°F",
    "RPM": "rpm",
    "Volts": "V",
    "Amps": "A",
    "Watts": "W",
    "Joules": "J",
    "percent": "%",
    "CFM": "CFM",
}


class HostConfig(GroupOptions):
    name: str
    """Entity name: sensors are ``<prefix>/<name>/<sensor>``."""
    host: str | None = None
    """BMC address; None = the local BMC (/dev/ipmi0)."""
    username: str | None = None
    password: str | None = None
    password_file: str | None = None
    interface: Literal["lan", "lanplus"] = "lanplus"
    sensors: list[str] | None = None
    """SDR sensor names to read (default: every threshold sensor the BMC has)."""


class IpmiConfig(PluginConfig):
    backend: Literal["ipmitool", "pyghmi"] = "ipmitool"
    ipmitool: str = "ipmitool"
    """ipmitool binary."""
    interval_ms: int = interval_field(10_000)
    timeout_ms: int | None = Field(5_000, ge=1)
    hosts: list[HostConfig] = Field(min_length=1)


def parse_sensor_output(text: str) -> dict[str, tuple[float, str | None]]:
    """``ipmitool sensor`` lines -> {name: (value, unit)} for readable threshold sensors."""
    out: dict[str, tuple[float, str | None]] = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) < 3 or cols[2] == "discrete":
            continue
        try:
            value = float(cols[1])
        except ValueError:
            continue  # "na": the sensor exists but has no reading now
        out[cols[0]] = (value, UNITS.get(cols[2], cols[2] or None))
    return out


def sensor_level(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", name.strip()).strip("_") or "_"


def sensor_values(text: str) -> dict[str, float]:
    return {k: v for k, (v, _) in parse_sensor_output(text).items()}


class Bmc(TextSource):
    """One BMC: ``ipmitool ... sensor`` with the password in the environment."""

    def __init__(self, cfg: HostConfig, plugin: IpmiConfig, context: PluginContext) -> None:
        password = cfg.password
        if cfg.password_file:
            password = context.path(cfg.password_file).read_text().strip()
        argv = context.command([plugin.ipmitool], ["ipmitool"])
        if cfg.host:
            argv += ["-I", cfg.interface, "-H", cfg.host, "-N", "1", "-R", "1"]
            if cfg.username:
                argv += ["-U", cfg.username]
            if password is not None:
                argv += ["-E"]
        env = {"IPMI_PASSWORD": password} if password is not None else None
        super().__init__(cfg.name, argv=[*argv, "sensor"], env=env)
        self.cfg = cfg
        self.password = password

    def read_pyghmi(self) -> dict[str, tuple[float, str | None]]:
        from pyghmi.ipmi import command  # optional dependency, imported only when used

        cmd = command.Command(
            bmc=self.cfg.host, userid=self.cfg.username, password=self.password, keepalive=False
        )
        out: dict[str, tuple[float, str | None]] = {}
        for r in cmd.get_sensor_data():
            if isinstance(r.value, int | float):
                out[r.name] = (float(r.value), UNITS.get(r.units, r.units or None))
        return out


class PyghmiGroup(Group):
    """All sensors of one BMC through pyghmi (blocking: the group's worker thread)."""

    blocking = True

    def __init__(
        self, name: str, sensors: list[Sensor], options: GroupOptions, bmc: Bmc, keys: list[str]
    ) -> None:
        super().__init__(name, sensors, options, bmc)
        self.bmc = bmc
        self.keys = keys

    def read(self, timestamp_ns: int) -> Values:
        found = self.bmc.read_pyghmi()
        nan = (float("nan"), None)
        return array("d", [found.get(k, nan)[0] for k in self.keys])


class IpmiPlugin(Plugin):
    """BMC sensors of many hosts."""

    Config = IpmiConfig
    description = "IPMI sensors per BMC (ipmitool or pyghmi)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, IpmiConfig)
        groups: list[Group] = []
        for h in cfg.hosts:
            bmc = Bmc(h, cfg, self.context)
            self.entities.append(bmc)
            opts = self.options_of(h)
            try:
                found = await wait_for(self._probe(bmc, cfg), (opts.timeout_ms or 5000) / 1000)
            except (KelvinError, OSError, TimeoutError) as exc:
                if h.sensors is None:
                    reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                    self.notes.append(f"host {h.name} skipped: {reason}")
                    log.warning(
                        "ipmi %s: host %s skipped: %s", self.context.instance, h.name, reason
                    )
                    continue
                found = {}
            keys = h.sensors if h.sensors is not None else sorted(found)
            sensors = [
                self.sensor(f"{h.name}/{sensor_level(k)}", opts, found.get(k, (0.0, None))[1])
                for k in keys
            ]
            if cfg.backend == "pyghmi":
                groups.append(PyghmiGroup(h.name, sensors, opts, bmc, keys))
            else:
                groups.append(ParsedGroup(h.name, sensors, opts, bmc, sensor_values, keys))
        if not groups:
            raise KelvinError(
                f"ipmi plugin {self.context.instance!r}: no BMC answered ({'; '.join(self.notes)})"
            )
        return groups

    async def _probe(self, bmc: Bmc, cfg: IpmiConfig) -> dict[str, tuple[float, str | None]]:
        if cfg.backend == "pyghmi":
            return await asyncio.to_thread(bmc.read_pyghmi)
        return parse_sensor_output(await bmc.text())
