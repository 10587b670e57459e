"""Prometheus counters and gauges and the text exposition format, without the client library.

The pusher's ``/metrics`` needs counters and gauges with labels and the
process metrics every Prometheus client exports; ``prometheus_client`` brings
those plus an HTTP server, multiprocess support and OpenMetrics that a node's
pusher does not use. The output is the text format 0.0.4 as
``prometheus_client`` writes it (same names, ``_total`` suffix, number format),
so dashboards and the services' scrapes read it the same way.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from collections.abc import Iterator, Sequence

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"


def go_float(value: float) -> str:
    """A float as Prometheus' Go client prints it (``1.0``, ``+Inf``, ``1.5e+06``)."""
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    s = repr(float(value))
    dot = s.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Value:
    """One sample's number (``prometheus_client`` keeps it as ``child._value``)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def get(self) -> float:
        return self.value


class _Child:
    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = _Value()

    def inc(self, amount: float = 1.0) -> None:
        self._value.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._value.value -= amount

    def set(self, value: float) -> None:
        self._value.value = float(value)


class Metric:
    """A counter or gauge, with or without labels."""

    def __init__(self, kind: str, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        self.kind = kind
        self.name = name
        self.doc = doc
        self.label_names = tuple(labels)
        self._children: dict[tuple[str, ...], _Child] = {}
        if not self.label_names:
            self._children[()] = _Child()

    def labels(self, *values: object) -> _Child:
        if len(values) != len(self.label_names):
            raise ValueError(f"{self.name}: expected labels {self.label_names}, got {values}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _Child()
        return child

    @property
    def _value(self) -> _Value:
        return self._children[()]._value

    def inc(self, amount: float = 1.0) -> None:
        self._children[()].inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._children[()].dec(amount)

    def set(self, value: float) -> None:
        self._children[()].set(value)

    def lines(self) -> Iterator[str]:
        sample = self.name + ("_total" if self.kind == "counter" else "")
        yield f"# HELP {sample} {self.doc}"
        yield f"# TYPE {sample} {self.kind}"
        for key, child in self._children.items():
            if key:
                labels = ",".join(
                    f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, key, strict=True)
                )
                yield f"{sample}{{{labels}}} {go_float(child._value.value)}"
            else:
                yield f"{sample} {go_float(child._value.value)}"


def _process_lines() -> Iterator[str]:
    """The process collector's samples (``process_*``), read from /proc when scraped."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/stat", "rb") as f:
            btime = next(float(ln.split()[1]) for ln in f if ln.startswith(b"btime"))
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        vsize, rss = float(fields[20]), float(fields[21]) * page
        start = btime + int(fields[19]) / ticks
        fds = len(os.listdir("/proc/self/fd"))
        max_fds = float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (OSError, ValueError, IndexError, StopIteration):
        return
    for name, kind, doc, value in (
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss),
        ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", start),
        ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", cpu),
        ("process_open_fds", "gauge", "Number of open file descriptors.", float(fds)),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds),
    ):  # fmt: skip
        yield f"# HELP {name} {doc}"
        yield f"# TYPE {name} {kind}"
        yield f"{name} {go_float(value)}"
    impl = platform.python_implementation()
    major, minor, patch = platform.python_version_tuple()
    yield "# HELP python_info Python platform information"
    yield "# TYPE python_info gauge"
    yield (
        f'python_info{{implementation="{impl}",major="{major}",minor="{minor}",'
        f'patchlevel="{patch}",version="{platform.python_version()}"}} 1.0'
    )


class Registry:
    """A service's metrics, named ``kelvin_<service>_<thing>``, rendered in one text page."""

    def __init__(self, service: str, process: bool = True) -> None:
        self.service = service
        self.prefix = f"kelvin_{service}_"
        self.process = process
        self._metrics: list[Metric] = []
        self.started = time.time()
        self.up = self.gauge("up", "1 while the service is serving")
        self.info = self.gauge("build_info", "Build information", ["version"])

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Metric:
        """``name`` without prefix; the exposition adds ``_total``."""
        m = Metric("counter", self.prefix + name.removesuffix("_total"), doc, labels)
        self._metrics.append(m)
        return m

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Metric:
        m = Metric("gauge", self.prefix + name, doc, labels)
        self._metrics.append(m)
        return m

    def render(self) -> bytes:
        lines: list[str] = list(_process_lines()) if self.process else []
        for m in self._metrics:
            lines.extend(m.lines())
        return ("\n".join(lines) + "\n").encode()
