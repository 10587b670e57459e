"""A real Debian ``prometheus-alertmanager`` on loopback (its v2 API is what Kelvin talks to)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import free_port, require_binary, stop_process, wait_port

CONFIG = """route:
  receiver: nowhere
  group_wait: 0s
  group_interval: 1s
receivers:
  - name: nowhere
"""


class Alertmanager:
    def __init__(self, workdir: Path) -> None:
        self.binary = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Alertmanager:
        cfg = self.workdir / "alertmanager.yml"
        cfg.write_text(CONFIG)
        self.log = open(self.workdir / "alertmanager.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={cfg}", f"--storage.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_port(self.port, timeout=30, proc=self.proc)
        deadline = time.monotonic() + 30
        while httpx.get(f"{self.url}/-/ready").status_code != 200:
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.05)
        return self

    def alerts(self, **params: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v2/alerts", params=params)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def tail(self) -> str:
        return (self.workdir / "alertmanager.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.proc = None
