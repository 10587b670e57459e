"""``ipmi``: BMC sensors per host (one entity per BMC), through ``ipmitool`` or pyghmi.

With ``ipmitool`` (default) every read runs ``ipmitool [-I lanplus -H host -U
user -E] sensor`` as an asyncio subprocess, killed when the read times out;
the password goes through the environment (``-E``), never the command line.
With ``pyghmi`` (pure Python, RMCP+) reads run in the group's worker thread.
Threshold sensors become ``<prefix>/<host name>/<sensor>`` with their unit
(``degrees C`` -> ``°C``, ``Watts`` -> ``W``, ...); discrete sensors are skipped.
Without a ``sensors`` list the host is asked once at load time which it has;
a host that does not answer then is skipped and named in the plugin's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, Field

from services.common.errors import KelvinError
from services.common.readings import Float64Array
from services.pusher.plugins.base import (
    Entity,
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
)

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
    interval_ms: int = Field(
        10_000, ge=1, validation_alias=AliasChoices("interval_ms", "interval", "intervalMs")
    )
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


class Bmc(Entity):
    """One BMC: how to reach it."""

    def __init__(self, cfg: HostConfig, plugin: IpmiConfig, base: Path | None) -> None:
        super().__init__(cfg.name)
        self.cfg = cfg
        self.tool = plugin.ipmitool
        self.password = cfg.password
        if cfg.password_file:
            path = Path(cfg.password_file)
            path = path if path.is_absolute() or base is None else base / path
            self.password = path.read_text().strip()

    def argv(self) -> list[str]:
        args = [self.tool]
        if self.cfg.host:
            args += ["-I", self.cfg.interface, "-H", self.cfg.host, "-N", "1", "-R", "1"]
            if self.cfg.username:
                args += ["-U", self.cfg.username]
            if self.password is not None:
                args += ["-E"]
        return [*args, "sensor"]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.password is not None:
            env["IPMI_PASSWORD"] = self.password
        return env

    async def run(self) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(),
            start_new_session=True,  # so that a timeout kills whatever it started, too
        )
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if proc.returncode != 0:
            msg = err.decode(errors="replace").strip().splitlines()
            raise KelvinError(
                f"ipmitool for {self.name} exited with {proc.returncode}: "
                f"{msg[-1] if msg else 'no message'}"
            )
        return out.decode(errors="replace")

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


class IpmitoolGroup(Group):
    """All sensors of one BMC, one ``ipmitool sensor`` per read."""

    def __init__(
        self, name: str, sensors: list[Sensor], options: GroupOptions, bmc: Bmc, keys: list[str]
    ) -> None:
        super().__init__(name, sensors, options, bmc)
        self.bmc = bmc
        self.keys = keys

    async def read_async(self, timestamp_ns: int) -> Float64Array:
        return self._values(parse_sensor_output(await self.bmc.run()))

    def _values(self, found: dict[str, tuple[float, str | None]]) -> Float64Array:
        nan = float("nan")
        return np.array([found.get(k, (nan, None))[0] for k in self.keys], dtype=np.float64)


class PyghmiGroup(IpmitoolGroup):
    blocking = True

    def read(self, timestamp_ns: int) -> Float64Array:
        return self._values(self.bmc.read_pyghmi())

    @property
    def is_async(self) -> bool:
        return False


class IpmiPlugin(Plugin):
    """BMC sensors of many hosts."""

    Config = IpmiConfig
    description = "IPMI sensors per BMC (ipmitool or pyghmi)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, IpmiConfig)
        self.skipped: list[str] = []
        groups: list[Group] = []
        for h in cfg.hosts:
            bmc = Bmc(h, cfg, self.context.config_dir)
            self.entities.append(bmc)
            overrides: dict[str, Any] = h.model_dump(
                exclude_unset=True, include=set(GroupOptions.model_fields)
            )
            opts = self.group_options(**overrides)
            try:
                found = await asyncio.wait_for(
                    self._probe(bmc, cfg), (opts.timeout_ms or 5000) / 1000
                )
            except (KelvinError, OSError, TimeoutError) as exc:
                if h.sensors is None:
                    reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                    self.skipped.append(f"{h.name}: {reason}")
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
            cls = PyghmiGroup if cfg.backend == "pyghmi" else IpmitoolGroup
            groups.append(cls(h.name, sensors, opts, bmc, keys))
        if not groups:
            raise KelvinError(
                f"ipmi plugin {self.context.instance!r}: no BMC answered ({'; '.join(self.skipped)})"
            )
        return groups

    async def _probe(self, bmc: Bmc, cfg: IpmiConfig) -> dict[str, tuple[float, str | None]]:
        if cfg.backend == "pyghmi":
            return await asyncio.to_thread(bmc.read_pyghmi)
        return parse_sensor_output(await bmc.run())
