"""A real Debian ``prometheus`` (and ``promtool``) on loopback, fed exact samples.

:func:`openmetrics` writes series as OpenMetrics text (millisecond timestamps written
so that promtool's ``int64(seconds * 1000)`` lands on the intended millisecond),
:class:`Prometheus` backfills it with ``promtool tsdb create-blocks-from openmetrics``
and serves the blocks with a long retention, or runs any other configuration.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import numpy as np

from tests.support.servers import free_port, require_binary, stop_process, wait_port

Series = tuple[dict[str, str], np.ndarray, np.ndarray]
"""(labels with __name__, timestamps in ns on whole milliseconds, values)."""


def _om_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _om_escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(series: Iterable[Series]) -> str:
    families: dict[str, list[str]] = {}
    for labels, ts, vs in series:
        name = labels["__name__"]
        lab = ",".join(
            f'{k}="{_om_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__"
        )
        rows = families.setdefault(name, [])
        for t, v in zip(ts.tolist(), vs.tolist(), strict=True):
            ms = t // 1_000_000
            # promtool truncates seconds * 1000: aim at the middle of the millisecond
            rows.append(f"{name}{{{lab}}} {_om_value(v)} {ms // 1000}.{ms % 1000:03d}5")
    lines: list[str] = []
    for name, rows in families.items():
        lines.append(f"# TYPE {name} unknown")
        lines.extend(rows)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


class Prometheus:
    """One prometheus process; ``url`` once :meth:`start` returned."""

    def __init__(self, workdir: Path, config: str = "global:\n  scrape_interval: 1h\n") -> None:
        self.binary = require_binary("prometheus", "prometheus")
        self.workdir = workdir
        self.tsdb = workdir / "tsdb"
        self.config = workdir / "prometheus.yml"
        self.config.write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def backfill(self, text: str) -> None:
        promtool = require_binary("promtool", "prometheus")
        data = self.workdir / "data.om"
        data.write_text(text)
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(self.tsdb)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def start(self, *extra: str) -> Prometheus:
        self.log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.tsdb}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_port(self.port, timeout=30, proc=self.proc)
        deadline = time.monotonic() + 60
        while httpx.get(f"{self.url}/-/ready").status_code != 200:  # blocks loaded
            if time.monotonic() > deadline:
                raise TimeoutError(self.tail())
            time.sleep(0.05)
        return self

    def tail(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.proc = None


class KelvinService:
    """One ``kelvin run <service>`` process with a YAML configuration (as its container runs)."""

    def __init__(self, workdir: Path, service: str, config: str, port: int) -> None:
        self.workdir = workdir
        self.service = service
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config = workdir / f"{service}.yaml"
        self.config.write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> KelvinService:
        return self.spawn().wait()

    def spawn(self) -> KelvinService:
        """Start the process without waiting for it (start several, then wait for each)."""
        import os
        import sys

        self.log = open(self.workdir / f"{self.service}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "run", self.service, "--config", str(self.config)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        return self

    def wait(self) -> KelvinService:
        wait_port(self.port, timeout=30, proc=self.proc)
        return self

    def tail(self) -> str:
        return (self.workdir / f"{self.service}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self.proc = None
