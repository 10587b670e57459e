"""``opa``: Omni-Path / InfiniBand port counters, from sysfs or from ``perfquery``.

Default: every port of every device under ``<root>/class/infiniband`` and all
files in its ``counters/`` directory, as ``<prefix>/<device>/port<n>/<counter>``
(monotonic). ``port_xmit_data`` and ``port_rcv_data`` count 4-byte words (IB
specification) and are published in bytes (x ``data_word_bytes``). With
``command`` (e.g. ``["perfquery", "-x"]``) the output's ``Name:....value``
lines become ``<prefix>/<name>/<Name>`` instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.common.errors import ConfigError
from services.common.schema import Field
from services.pusher.plugins.base import Group, Plugin, PluginConfig
from services.pusher.plugins.sysfs import FileGroup
from services.pusher.plugins.text import ParsedGroup, TextSource

_DOTTED = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*):\.*\s*(0x[0-9a-fA-F]+|-?\d+(?:\.\d+)?)\s*$")
_DATA = {"port_xmit_data", "port_rcv_data"}


class OpaConfig(PluginConfig):
    root: str = "/sys"
    devices: list[str] | None = None
    """Devices to read (default all under class/infiniband)."""
    counters: list[str] | None = None
    """Counter file names to publish (default all)."""
    data_word_bytes: int = Field(4, ge=1)
    command: list[str] | None = None
    """Run this tool instead (perfquery-style ``Name:....value`` output)."""
    name: str = "port"
    """Sensor level for the command's counters."""


def parse_dotted(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _DOTTED.match(line)
        if m:
            v = m.group(2)
            out[m.group(1)] = float(int(v, 16)) if v.startswith("0x") else float(v)
    return out


class OpaPlugin(Plugin):
    """Fabric port counters."""

    Config = OpaConfig
    description = "Omni-Path/InfiniBand port counters (sysfs or perfquery)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, OpaConfig)
        opts = self.group_options()
        if cfg.command is not None:
            source = TextSource("perfquery", argv=self.context.command(cfg.command, None))
            self.entities.append(source)
            keys = [
                k
                for k in parse_dotted(await source.text())
                if k not in ("PortSelect", "CounterSelect")
            ]
            sensors = [self.sensor(f"{cfg.name}/{k}", opts, monotonic=True) for k in keys]
            return [ParsedGroup("perfquery", sensors, opts, source, parse_dotted, keys)]
        base = self.context.path(cfg.root) / "class" / "infiniband"
        devices = sorted(p.name for p in base.glob("*")) if cfg.devices is None else cfg.devices
        sensors, paths, mult = [], [], []
        for dev in devices:
            ports = sorted((base / dev / "ports").glob("*"), key=lambda p: p.name)
            if not ports:
                raise ConfigError(
                    f"opa plugin {self.context.instance!r}: no ports under {base / dev}; "
                    "set 'root' or 'devices'"
                )
            for port in ports:
                for f in sorted((port / "counters").glob("*")):
                    if cfg.counters is not None and f.name not in cfg.counters:
                        continue
                    data = f.name in _DATA
                    sensors.append(
                        self.sensor(
                            f"{dev}/port{port.name}/{f.name}",
                            opts,
                            "B" if data else None,
                            monotonic=True,
                        )
                    )
                    paths.append(Path(f))
                    mult.append(float(cfg.data_word_bytes) if data else 1.0)
        if not sensors:
            raise ConfigError(
                f"opa plugin {self.context.instance!r}: no port counters found under {base}"
            )
        return [FileGroup("counters", sensors, opts, paths, mult)]
