"""``procfs``: ``/proc/meminfo``, ``/proc/vmstat`` and ``/proc/stat`` (per CPU).

One group per file. Sensors: ``<prefix>/meminfo/MemFree`` (KiB, as the kernel
prints it), ``<prefix>/vmstat/pgfault`` (counters are marked monotonic: every
key not starting with ``nr_``, plus ``nr_dirtied``/``nr_written``),
``<prefix>/cpu/user`` (all CPUs) and ``<prefix>/cpu0/user`` (one CPU), in
seconds (USER_HZ ticks with DCDB scale 1/USER_HZ, so DCDB integers are the
ticks), and ``<prefix>/stat/ctxt``, ``.../processes``, ``.../procs_running``,
``.../procs_blocked``, ``.../intr``, ``.../softirq``. Files under ``/proc`` are
generated from kernel memory, so reads run inline on the event loop: a
thread hop would cost more than the read.
"""

from __future__ import annotations

import functools
import os
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from services.common.errors import ConfigError
from services.pusher.plugins.base import Group, GroupOptions, Plugin, PluginConfig, Sensor, Values

CPU_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)
_STAT_SINGLE = ("ctxt", "processes", "procs_running", "procs_blocked", "intr", "softirq")
_STAT_COUNTERS = {"ctxt", "processes", "intr", "softirq"}
_VMSTAT_COUNTER_NR = {"nr_dirtied", "nr_written"}

Parser = Callable[[str], dict[str, float]]


class ProcfsConfig(PluginConfig):
    root: str = "/proc"
    """Where procfs is mounted (a fake tree in tests, /host/proc in a container)."""
    files: list[Literal["meminfo", "vmstat", "stat"]] = ["meminfo", "vmstat", "stat"]
    meminfo: list[str] | None = None
    """meminfo keys to publish (default all)."""
    vmstat: list[str] | None = None
    """vmstat keys to publish (default all)."""
    cpus: bool = True
    """One sensor set per CPU (``cpu0/...``), besides the total (``cpu/...``)."""
    cpu_fields: list[Literal[CPU_FIELDS]] | None = None  # type: ignore[valid-type]
    """Columns of the cpu lines (default all ten)."""


def parse_meminfo(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key.strip()] = float(parts[0])
    return out


def parse_vmstat(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = float(parts[1])
    return out


def parse_stat(text: str, user_hz: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith("cpu"):
            for field, val in zip(CPU_FIELDS, parts[1:], strict=False):
                out[f"{key}/{field}"] = float(val) / user_hz
        elif key in _STAT_SINGLE and len(parts) > 1:
            out[f"stat/{key}"] = float(parts[1])
    return out


class KeyFileGroup(Group):
    """A file of keys and values, parsed whole on every read."""

    def __init__(
        self,
        name: str,
        sensors: list[Sensor],
        options: GroupOptions,
        path: Path,
        parser: Parser,
        keys: list[str],
    ) -> None:
        super().__init__(name, sensors, options)
        self.path = path
        self.parser = parser
        self.keys = keys

    def read(self, timestamp_ns: int) -> Values:
        with open(self.path, encoding="ascii", errors="replace") as f:
            found = self.parser(f.read())
        nan = float("nan")
        return array("d", [found.get(k, nan) for k in self.keys])


class ProcfsPlugin(Plugin):
    """Memory, VM and CPU counters of the node."""

    Config = ProcfsConfig
    description = "/proc/meminfo, /proc/vmstat, /proc/stat (per CPU)"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, ProcfsConfig)
        root = self.context.path(cfg.root)
        hz = float(os.sysconf("SC_CLK_TCK"))
        opts = self.group_options()
        groups: list[Group] = []
        for file in cfg.files:
            path = root / file
            try:
                text = path.read_text(encoding="ascii", errors="replace")
            except OSError as exc:
                raise ConfigError(
                    f"procfs plugin {self.context.instance!r}: cannot read {path}: "
                    f"{exc.strerror}; set 'root' to where procfs is mounted"
                ) from exc
            if file == "meminfo":
                kib = {ln.split(":")[0] for ln in text.splitlines() if ln.rstrip().endswith("kB")}
                keys = _select(list(parse_meminfo(text)), cfg.meminfo, path)
                sensors = [
                    self.sensor(f"meminfo/{k}", opts, "KiB" if k in kib else None) for k in keys
                ]
                groups.append(KeyFileGroup(file, sensors, opts, path, parse_meminfo, keys))
            elif file == "vmstat":
                keys = _select(list(parse_vmstat(text)), cfg.vmstat, path)
                sensors = [
                    self.sensor(
                        f"vmstat/{k}",
                        opts,
                        monotonic=not k.startswith("nr_") or k in _VMSTAT_COUNTER_NR,
                    )
                    for k in keys
                ]
                groups.append(KeyFileGroup(file, sensors, opts, path, parse_vmstat, keys))
            else:
                fields = cfg.cpu_fields or list(CPU_FIELDS)
                keys = [
                    k
                    for k in parse_stat(text, hz)
                    if not k.startswith("cpu")
                    or (k.split("/")[1] in fields and (cfg.cpus or k.startswith("cpu/")))
                ]
                sensors = [
                    self.sensor(k, opts, "s", monotonic=True, scale=1.0 / hz)
                    if k.startswith("cpu")
                    else self.sensor(k, opts, monotonic=k.split("/")[1] in _STAT_COUNTERS)
                    for k in keys
                ]
                groups.append(
                    KeyFileGroup(
                        file, sensors, opts, path, functools.partial(parse_stat, user_hz=hz), keys
                    )
                )
        return groups


def _select(found: list[str], wanted: list[str] | None, path: Path) -> list[str]:
    if wanted is None:
        return found
    missing = [k for k in wanted if k not in found]
    if missing:
        raise ConfigError(
            f"{path} has no key(s) {', '.join(missing)}; it has e.g. {', '.join(found[:8])}"
        )
    return list(wanted)
