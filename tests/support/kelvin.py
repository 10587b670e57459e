"""Run ``kelvin up`` (optionally ``--demo``) as a subprocess on free ports and a temp data dir.

The process prints where the console is once every service runs; :meth:`KelvinUp.start`
waits for that line (a reader thread copies the output to ``kelvin.log`` and signals it),
not for a fixed time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from services.common.auth import Role
from tests.support.servers import free_port

ANNOUNCE = re.compile(r"^\s*console\s+(http://\S+)$")
PORT_FLAGS = {
    "mqtt": "--mqtt-port",
    "collect_agent": "--collect-agent-port",
    "pusher": "--pusher-port",
    "query_api": "--query-api-port",
    "allocator": "--allocator-port",
}


class KelvinUp:
    """One ``kelvin up`` process; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(self, data_dir: Path, *args: str, config: Path | None = None) -> None:
        self.data_dir = data_dir
        self.ports = {k: free_port() for k in PORT_FLAGS}
        self.log = data_dir / "kelvin.log"
        self.cmd = [sys.executable, "-m", "services.cli", "up", "--data-dir", str(data_dir), *args]
        for key, flag in PORT_FLAGS.items():
            self.cmd += [flag, str(self.ports[key])]
        if config is not None:
            self.cmd += ["--config", str(config)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        """time.monotonic() when the process was spawned (deadlines count from it)."""
        self.console_url = ""
        self._lines: list[str] = []
        self._announced = threading.Event()

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def token(self, role: Role = Role.ADMIN) -> str:
        """The token of ``role`` this ``kelvin up`` generated into its data directory."""
        doc = json.loads((self.data_dir / "auth" / "tokens.json").read_text())
        return str(doc[role.value])

    def headers(self, role: Role = Role.ADMIN) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(role)}"}

    def start(self, timeout_s: float = 40.0) -> KelvinUp:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.data_dir, env=env
        )
        threading.Thread(target=self._copy_output, name="kelvin-up-output", daemon=True).start()
        if not self._announced.wait(timeout_s):
            self.stop()
            raise TimeoutError(
                f"kelvin up did not announce its console in {timeout_s} s:\n{self.tail()}"
            )
        if not self.console_url:
            self.stop()
            raise RuntimeError(f"kelvin up exited with {self.proc.returncode}:\n{self.tail()}")
        return self

    def _copy_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log, "w", encoding="utf-8") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                log.flush()
                self._lines.append(line)
                m = ANNOUNCE.match(line.rstrip("\n"))
                if m and not self.console_url:
                    self.console_url = m.group(1)
                    self._announced.set()
        self._announced.set()  # exited (before or after announcing)

    def output(self) -> str:
        return "".join(self._lines)

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)
