"""Run ``kelvin up`` (optionally ``--demo``) or ``kelvin run <service>`` as a subprocess on
free ports and a temp data dir.

The process prints what it runs once every service is up; :meth:`KelvinUp.start` waits
for that (a reader thread copies the output to ``kelvin.log`` and signals it), not for a
fixed time. :meth:`KelvinUp.stop` signals it and waits as long as the process says its
stop may take (it logs that deadline as it begins to stop; past it, it exits with status
1 whatever hangs), plus :data:`STOP_MARGIN_S`.
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
READY = "Stop with Ctrl-C."
"""The last line of what ``kelvin up``/``run`` prints once every service runs."""
DEADLINE = re.compile(r"exits with status 1 unless stopped within (\d+) s")
STOP_MARGIN_S = 30.0
"""Past the deadline the process itself keeps: exiting, on a loaded machine."""
SIGNALLED_S = 30.0
"""How soon after the signal the process must log its deadline."""
PORT_FLAGS = {
    "mqtt": "--mqtt-port",
    "collect_agent": "--collect-agent-port",
    "pusher": "--pusher-port",
    "query_api": "--query-api-port",
    "allocator": "--allocator-port",
    "slurm_bridge": "--slurm-bridge-port",
}


class KelvinUp:
    """One ``kelvin up`` (or, with ``command``, e.g. ``("run", "pusher")``) process on free
    ports (``ports`` sets some: ``mqtt`` is the broker of a pusher or allocator run alone);
    ``stop()`` signals it (SIGTERM unless told) and returns the exit code."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        config: Path | None = None,
        command: tuple[str, ...] = ("up",),
        ports: dict[str, int] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.ports = {k: free_port() for k in PORT_FLAGS} | (ports or {})
        self.log = data_dir / "kelvin.log"
        self.cmd = [sys.executable, "-m", "services.cli", *command, "--data-dir", str(data_dir)]
        self.cmd += args
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
        self._ready = False
        self._deadline_s: float | None = None
        self._deadline_logged = threading.Event()

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
        if not self._ready:
            self.stop()
            raise RuntimeError(f"kelvin exited with {self.proc.returncode}:\n{self.tail()}")
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
                if line.strip() == READY:
                    self._ready = True
                    self._announced.set()
                d = DEADLINE.search(line)
                if d and self._deadline_s is None:
                    self._deadline_s = float(d.group(1))
                    self._deadline_logged.set()
        self._announced.set()  # exited (before or after announcing)
        self._deadline_logged.set()

    def output(self) -> str:
        return "".join(self._lines)

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send ``sig`` and wait for the exit within the deadline the process logs as it
        begins to stop (plus :data:`STOP_MARGIN_S`); a process still there then is killed,
        and its negative status returned, so that ``stop() == 0`` is the bounded clean stop."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self._deadline_logged.wait(SIGNALLED_S)
            bound = (self._deadline_s or 0.0) + STOP_MARGIN_S
            try:
                self.proc.wait(bound)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._lines.append(f"[test] still running {bound:.0f} s after {sig.name}: killed\n")
        return int(self.proc.returncode)
