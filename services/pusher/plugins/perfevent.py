"""``perfevent``: hardware and software counters per CPU through ``perf_event_open``.

The system call is made through ctypes (no extra dependency). One counter per
(CPU, event), counting system-wide on that CPU (``pid = -1``), which needs
``kernel.perf_event_paranoid <= 0`` or CAP_PERFMON/CAP_SYS_ADMIN; where the
kernel refuses, the plugin fails with the reason and the fix. Events the CPU
or hypervisor does not expose (``ENOENT``/``EOPNOTSUPP``: common in VMs for
hardware events) are skipped with a warning, listed in the plugin's status.
Counts are scaled for multiplexing (value x enabled / running). Sensors:
``<prefix>/cpu<N>/<event>``; by default published as deltas per interval.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import platform
import struct
from array import array
from pathlib import Path

from services.common.errors import ConfigError, KelvinError
from services.common.schema import Model, ModelConfig
from services.pusher.plugins.base import Group, GroupOptions, Plugin, PluginConfig, Sensor, Values

log = logging.getLogger(__name__)

TYPE_HARDWARE, TYPE_SOFTWARE = 0, 1
EVENTS: dict[str, tuple[int, int]] = {
    "cycles": (TYPE_HARDWARE, 0),
    "instructions": (TYPE_HARDWARE, 1),
    "cache-references": (TYPE_HARDWARE, 2),
    "cache-misses": (TYPE_HARDWARE, 3),
    "branches": (TYPE_HARDWARE, 4),
    "branch-misses": (TYPE_HARDWARE, 5),
    "bus-cycles": (TYPE_HARDWARE, 6),
    "ref-cycles": (TYPE_HARDWARE, 9),
    "cpu-clock": (TYPE_SOFTWARE, 0),
    "task-clock": (TYPE_SOFTWARE, 1),
    "page-faults": (TYPE_SOFTWARE, 2),
    "context-switches": (TYPE_SOFTWARE, 3),
    "cpu-migrations": (TYPE_SOFTWARE, 4),
}
_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "riscv64": 241, "s390x": 331}
_FORMAT_ENABLED_RUNNING = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | _RUNNING
_FLAG_FD_CLOEXEC = 8
_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5


class _Attr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("rest", ctypes.c_uint8 * (_ATTR_SIZE - 48)),
    ]


class RawEvent(Model):
    model_config = ModelConfig(extra="forbid")

    name: str
    type: int
    """perf type (0 hardware, 1 software, 3 cache, 4 raw, or a PMU's type from sysfs)."""
    config: int


class PerfeventConfig(PluginConfig):
    events: list[str] = ["cycles", "instructions", "cache-misses", "branch-misses"]
    """Named events: see EVENTS (hardware and software)."""
    raw: list[RawEvent] = []
    """Further events by perf type and config."""
    cpus: list[int] | None = None
    """CPUs to count on (default: all online)."""
    delta: bool = True
    """Publish the increase per interval (the counters themselves only grow)."""
    paranoid_path: str = "/proc/sys/kernel/perf_event_paranoid"


def online_cpus(path: Path = Path("/sys/devices/system/cpu/online")) -> list[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.extend(range(int(a), int(b or a) + 1))
    return cpus


class PerfError(KelvinError):
    def __init__(self, message: str, err: int) -> None:
        super().__init__(message)
        self.errno = err


def perf_event_open(ptype: int, config: int, cpu: int) -> int:
    """Open a counting event on one CPU, system-wide; returns its file descriptor."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise PerfError(f"perf_event_open: unknown system call number on {platform.machine()}", 0)
    attr = _Attr()
    attr.type, attr.size, attr.config = ptype, _ATTR_SIZE, config
    attr.read_format = _FORMAT_ENABLED_RUNNING
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, ctypes.byref(attr), -1, cpu, -1, _FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfError(os.strerror(err), err)
    return int(fd)


class CounterGroup(Group):
    """All (CPU, event) counters; a read is one 24-byte read per counter."""

    def __init__(
        self, name: str, sensors: list[Sensor], options: GroupOptions, fds: list[int]
    ) -> None:
        super().__init__(name, sensors, options)
        self.fds = fds

    def read(self, timestamp_ns: int) -> Values:
        out = array("d", bytes(8 * len(self.fds)))
        for i, fd in enumerate(self.fds):
            value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
            out[i] = value * (enabled / running) if 0 < running < enabled else value
        return out

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


class PerfeventPlugin(Plugin):
    """CPU performance counters."""

    Config = PerfeventConfig
    description = "hardware/software counters per CPU via perf_event_open"

    async def build(self) -> list[Group]:
        cfg = self.config
        assert isinstance(cfg, PerfeventConfig)
        events: list[tuple[str, int, int]] = []
        for e in cfg.events:
            if e not in EVENTS:
                raise ConfigError(
                    f"perfevent plugin {self.context.instance!r}: unknown event {e!r}; "
                    f"expected one of {', '.join(EVENTS)} (or a 'raw' event)"
                )
            events.append((e, *EVENTS[e]))
        events += [(r.name, r.type, r.config) for r in cfg.raw]
        cpus = cfg.cpus if cfg.cpus is not None else online_cpus()
        opts = self.group_options()
        fds: list[int] = []
        sensors: list[Sensor] = []
        self.unsupported: list[str] = []
        try:
            for name, ptype, config in events:
                opened: list[tuple[int, int]] = []
                for cpu in cpus:
                    try:
                        opened.append((cpu, perf_event_open(ptype, config, cpu)))
                    except PerfError as exc:
                        for _, fd in opened:
                            os.close(fd)
                        if exc.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
                            self.unsupported.append(f"{name} ({exc})")
                            opened = []
                            break
                        raise self._refused(name, cpu, exc) from exc
                for cpu, fd in opened:
                    fds.append(fd)
                    sensors.append(self.sensor(f"cpu{cpu}/{name}", opts, monotonic=True))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        if self.unsupported:
            self.notes.append("not supported here, skipped: " + "; ".join(self.unsupported))
            log.warning(
                "perfevent %s: not supported on this machine, skipped: %s",
                self.context.instance,
                "; ".join(self.unsupported),
            )
        if not fds:
            raise KelvinError(
                f"perfevent plugin {self.context.instance!r}: none of the events can be counted "
                f"here ({'; '.join(self.unsupported)}); a VM often exposes no hardware PMU: try "
                "software events such as cpu-clock, context-switches"
            )
        return [CounterGroup("counters", sensors, opts, fds)]

    def _refused(self, event: str, cpu: int, exc: PerfError) -> KelvinError:
        cfg = self.config
        assert isinstance(cfg, PerfeventConfig)
        try:
            level = self.context.path(cfg.paranoid_path).read_text().strip()
        except OSError:
            level = "unknown"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return KelvinError(
                f"perfevent plugin {self.context.instance!r}: the kernel refuses to count "
                f"{event!r} on CPU {cpu} ({exc}): kernel.perf_event_paranoid is {level}; "
                "system-wide per-CPU counters need it <= 0 (sysctl -w kernel.perf_event_paranoid=0) "
                "or CAP_PERFMON (CAP_SYS_ADMIN before Linux 5.8) for the pusher"
            )
        return KelvinError(
            f"perfevent plugin {self.context.instance!r}: perf_event_open({event!r}, "
            f"CPU {cpu}) failed: {exc}"
        )
