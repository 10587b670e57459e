"""Collect agents as separate processes (``kelvin run collect-agent``), for kill -9 tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.auth import AUTH_SECTION
from tests.support.servers import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]


class AgentProcess:
    """One agent process with its own config file, ports, spool and log."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        sqlite: Path | None = None,
        storage: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        """``storage`` (the storage section) replaces the SQLite file ``sqlite``."""
        self.workdir, self.name = workdir, name
        self.storage = storage
        self.http_port = free_port()
        self.mqtt_port = free_port()
        self.spool_dir = workdir / f"spool-{name}"
        self.settings = {
            "host": "127.0.0.1",
            "port": self.http_port,
            "mqtt_port": self.mqtt_port,
            "spool_dir": str(self.spool_dir),
            "writer_retry_max_s": 0.2,
            **settings,
        }
        self.sqlite = sqlite or workdir / "kelvin.sqlite"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"agent-{name}.log"
        self.preexec: Callable[[], None] | None = None
        """Run in the child before exec (e.g. to set resource limits)."""

    def start(self, sqlite: Path | None = None) -> AgentProcess:
        if sqlite is not None:
            self.sqlite = sqlite
        cfg = self.workdir / f"agent-{self.name}.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "collect_agent": self.settings,
                    "storage": self.storage or {"sqlite": {"path": str(self.sqlite)}},
                    "auth": AUTH_SECTION,
                }
            )
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "run",
                    "collect-agent",
                    "--config",
                    str(cfg),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=self.preexec,
            )
        wait_port(self.http_port, timeout=30, proc=self.proc)
        return self

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM and wait for the exit; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self.proc = None
        return rc

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(f"http://127.0.0.1:{self.http_port}/api/v1/stats")
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

    async def until(self, what: str, check: Any, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll stats until ``check(stats)`` (a separate process has no event to await)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = await self.stats()
            if check(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"agent {self.name}: {what} not reached: {stats}")
            await asyncio.sleep(0.1)
