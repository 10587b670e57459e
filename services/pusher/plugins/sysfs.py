"""``sysfs``: any file, plus discovered hwmon and thermal-zone temperatures and RAPL energy.

Discovered sensors (each switch on by default):

* ``hwmon``: ``<prefix>/hwmon/<chip>/<label>`` for every ``temp*_input`` (°C, DCDB
  scale 0.001 so DCDB integers stay millidegrees);
* ``thermal``: ``<prefix>/thermal/<type>`` for every ``thermal_zone*`` (°C);
* ``rapl``: ``<prefix>/rapl/<zone>/energy`` for every powercap ``intel-rapl`` zone
  (J, monotonic; ``deltaMax`` = the zone's ``max_energy_range_uj`` so ``delta: true``
  handles the wrap);

and ``groups`` of files named in the configuration (``path``, optional ``regex``
with one group that captures the number). Sysfs attributes are kept open and
re-read with one ``pread`` at offset 0; reads run in the group's worker thread
because some drivers answer slowly (I2C sensors, BMC-backed hwmon).
"""

from __future__ import annotations

import contextlib
import os
import re
from array import array
from pathlib import Path
from typing import Any

from services.common.errors import ConfigError
from services.common.schema import Field, field_validator
from services.pusher.plugins.base import (
    Group,
    GroupOptions,
    Plugin,
    PluginConfig,
    Sensor,
    SensorOptions,
    Values,
)

_NAN = float("nan")


class FileSensorConfig(SensorOptions):
    name: str
    """Sensor name relative to the plugin prefix (``fan1`` or ``board/fan1``)."""
    path: str
    """File to read (relative paths resolve against ``root``)."""
    regex: str | None = None
    """Regular expression whose first group is the number (default: the whole file)."""
    unit: str | None = None

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                if re.compile(v).groups < 1:
                    raise ValueError("needs one capturing group around the number")
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from exc
        return v


class FileGroupConfig(GroupOptions):
    name: str
    sensors: list[FileSensorConfig] = Field(min_length=1)
    inline: bool | None = None
    """Read on the event loop instead of the group's worker thread (no thread hop: two
    wake-ups a cycle fewer). None = when every file is one the kernel answers from
    memory (``MEMORY_BACKED``), never for driver-backed ones (hwmon on I2C, ACPI)."""


MEMORY_BACKED = (
    "class/net/",
    "devices/virtual/net/",
    "block/",
    "devices/system/cpu/",
    "devices/system/node/",
    "fs/cgroup/",
    "kernel/mm/",
)
"""sysfs directories (relative to the root) whose attributes are kernel counters and
settings in memory: reading them cannot block on a device."""


def memory_backed(path: Path, root: Path) -> bool:
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return False
    return rel.startswith(MEMORY_BACKED)


class SysfsConfig(PluginConfig):
    root: str = "/sys"
    """Where sysfs is mounted (a fake tree in tests, /host/sys in a container)."""
    hwmon: bool = True
    thermal: bool = True
    rapl: bool = True
    groups: list[FileGroupConfig] = []


def _level(text: str) -> str:
    """A file's content or label as one sensor-name level."""
    out = re.sub(r"[^A-Za-z0-9_.:-]+", "_", text.strip()).strip("_")
    return out or "_"


def read_text(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8", errors="replace").strip()
    return ""


class FileGroup(Group):
    """Files read with pread; each value is (number in file) x multiplier."""

    blocking = True

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        paths: list[Path],
        multipliers: list[float],
        regexes: list[str | None] | None = None,
    ) -> None:
        super().__init__(name, sensors, options)
        self.paths = paths
        self.mult = [float(m) for m in multipliers]
        self.scaled = any(m != 1.0 for m in self.mult)
        self.regexes = [re.compile(r) if r else None for r in (regexes or [None] * len(paths))]
        self._fds: list[int | None] = [None] * len(paths)

    def _value(self, i: int) -> float:
        fd = self._fds[i]
        if fd is None:
            fd = self._fds[i] = os.open(self.paths[i], os.O_RDONLY)
        rx = self.regexes[i]
        # An attribute holding a number is short: a small read buffer is cheaper.
        raw = os.pread(fd, 4096 if rx is not None else 256, 0)
        if rx is None:
            try:
                return float(raw)  # the usual sysfs attribute: one number and a newline
            except ValueError:
                parts = raw.split()
                return float(parts[0]) if parts else _NAN
        m = rx.search(raw.decode("ascii", "replace"))
        return _NAN if m is None else float(m.group(1))

    def read(self, timestamp_ns: int) -> Values:
        n = len(self.paths)
        out = array("d", bytes(8 * n))
        value = self._value
        for i in range(n):
            try:
                out[i] = value(i)
            except (OSError, ValueError, IndexError):
                out[i] = _NAN  # a vanished or unreadable attribute: no reading this time
                self._drop(i)
        if self.scaled:
            mult = self.mult
            return array("d", [v * m for v, m in zip(out, mult, strict=True)])
        return out

    def _drop(self, i: int) -> None:
        fd = self._fds[i]
        self._fds[i] = None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for i in range(len(self._fds)):
            self._drop(i)


class SysfsPlugin(Plugin):
    """Files under /sys: hwmon, thermal zones, RAPL and anything configured."""

    Config = SysfsConfig
    description = "sysfs files; hwmon and thermal temperatures; RAPL energy counters"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, SysfsConfig)
        root = self.context.path(cfg.root)
        opts = self.group_options()
        groups: list[Group] = []
        found: list[tuple[str, str, Path, float, dict[str, Any]]] = []
        if cfg.hwmon:
            found += self._hwmon(root / "class" / "hwmon")
        if cfg.thermal:
            for zone in sorted((root / "class" / "thermal").glob("thermal_zone*")):
                if (zone / "temp").exists():
                    name = _level(read_text(zone / "type") or zone.name)
                    found.append(("thermal", name, zone / "temp", 0.001, {}))
        for kind in ("hwmon", "thermal"):
            part = [f for f in found if f[0] == kind]
            if part:
                sensors = [
                    self.sensor(f"{kind}/{rel}", opts, "°C", scale=0.001)
                    for _, rel, _, _, _ in part
                ]
                groups.append(
                    FileGroup(
                        kind, sensors, opts, [p for *_, p, _, _ in part], [m for *_, m, _ in part]
                    )
                )
        if cfg.rapl:
            rapl = self._rapl(root / "class" / "powercap", opts)
            if rapl is not None:
                groups.append(rapl)
        for g in cfg.groups:
            gopts = self.options_of(g)
            sensors, paths, regexes = [], [], []
            for s in g.sensors:
                path = Path(s.path) if Path(s.path).is_absolute() else root / s.path
                self.context.check_path(path)
                if not path.exists():
                    raise ConfigError(
                        f"sysfs plugin {self.context.instance!r}, group {g.name!r}, sensor "
                        f"{s.name!r}: file {path} does not exist"
                    )
                sensors.append(self.configured_sensor(s.name, gopts, s, s.unit))
                paths.append(path)
                regexes.append(s.regex)
            group = FileGroup(g.name, sensors, gopts, paths, [1.0] * len(paths), regexes)
            inline = g.inline
            if inline is None:
                inline = all(memory_backed(p, root) for p in paths)
            group.blocking = not inline
            groups.append(group)
        return groups

    def _hwmon(self, base: Path) -> list[tuple[str, str, Path, float, dict[str, Any]]]:
        out: list[tuple[str, str, Path, float, dict[str, Any]]] = []
        seen: dict[str, int] = {}
        for chip in sorted(base.glob("hwmon*"), key=lambda p: int(p.name[5:] or 0)):
            name = _level(read_text(chip / "name") or chip.name)
            n = seen[name] = seen.get(name, -1) + 1
            chip_name = name if n == 0 else f"{name}{n}"
            for inp in sorted(chip.glob("temp*_input")):
                stem = inp.name.removesuffix("_input")
                label = read_text(chip / f"{stem}_label")
                out.append(("hwmon", f"{chip_name}/{_level(label or stem)}", inp, 0.001, {}))
        return out

    def _rapl(self, base: Path, opts: GroupOptions) -> Group | None:
        zones = sorted(p for p in base.glob("intel-rapl:*") if (p / "energy_uj").exists())
        if not zones:
            return None
        sensors, paths, used = [], [], set()
        for z in zones:
            name = _level(read_text(z / "name") or z.name)
            if z.name.count(":") == 2:  # a sub-zone (core, dram) of a package
                up = z.parent / z.name.rsplit(":", 1)[0]
                name = f"{_level(read_text(up / 'name') or up.name)}/{name}"
            if name in used:
                name = f"{name}_{z.name.replace(':', '_')}"
            used.add(name)
            rng = read_text(z / "max_energy_range_uj")
            extra: dict[str, Any] = {}
            if rng.isdigit() and opts.delta_max is None:
                extra["delta_max"] = int(rng) * 1e-6
            sensors.append(
                self.sensor(f"rapl/{name}/energy", opts, "J", monotonic=True, scale=1e-6, **extra)
            )
            paths.append(z / "energy_uj")
        return FileGroup("rapl", sensors, opts, paths, [1e-6] * len(paths))
