"""The servers the benchmarks compare Kelvin with, started from Debian's packages, and Kelvin's.

Each runs as its own process on free loopback ports with its data in a
temporary directory; ``cpu_s()`` reads the process's CPU time from /proc so a
benchmark can charge each server for exactly the work it did. What each one
guarantees when it acknowledges a write is stated beside it (RESULTS.md repeats it).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, wait_port

ACKS = {
    "kelvin": "204 after the readings are in the agent's spool and fdatasync'ed (storage is written after)",
    "influxdb": "204 after the points are in InfluxDB's WAL and fsync'ed (queryable at once)",
    "victoriametrics": "204 once the points are in memory; flushed to disk about every second "
    "(a crash loses the last second or so)",
    "mosquitto": "PUBACK once the broker has the message in memory (no persistence configured)",
}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A started server process: ``port``, ``pid``, ``stop()``."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, work: Path) -> None:
        self.proc, self.port, self.work = proc, port, work

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def _start(argv: list[str], port: int, work: Path, env: dict[str, str] | None = None) -> Server:
    log = open(work / "server.log", "wb")  # noqa: SIM115 - kept open for the process's life
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_port(port, proc=proc, timeout=60)
    except BaseException:
        proc.kill()
        raise
    return Server(proc, port, work)


def victoria_metrics(work: Path) -> Server:
    binary = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
    if not Path(binary).exists():
        raise RuntimeError("victoria-metrics is not installed (apt-get install victoria-metrics)")
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    return _start(
        [binary, f"-storageDataPath={work / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
         "-retentionPeriod=100y", "-loggerLevel=ERROR"],
        port,
        work,
    )  # fmt: skip


def influxdb(work: Path) -> Server:
    from tests.support.influxdb import InfluxDB

    work.mkdir(parents=True, exist_ok=True)
    server = InfluxDB(work).start()
    assert server.proc is not None
    server.query("CREATE DATABASE bench")
    return Server(server.proc, server.port, work)


TOKEN = "bench-token-0123456789abcdef"
"""Kelvin's write (and admin) token in the benchmarks; reads stay open on loopback."""


def kelvin_agent(work: Path, env: dict[str, str] | None = None) -> Server:
    """``kelvin run collect-agent`` on the embedded SQLite store, defaults otherwise
    (``/write`` needs ``TOKEN``)."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    settings = {
        "KELVIN_COLLECT_AGENT_HOST": "127.0.0.1",
        "KELVIN_COLLECT_AGENT_PORT": str(port),
        "KELVIN_COLLECT_AGENT_MQTT_PORT": "0",
        "KELVIN_COLLECT_AGENT_SPOOL_DIR": str(work / "spool"),
        "KELVIN_STORAGE_SQLITE__PATH": str(work / "kelvin.sqlite"),
        "KELVIN_LOG_LEVEL": "WARNING",
        "KELVIN_LOGGING_ACCESS_LOG": "false",
        "KELVIN_AUTH_WRITE_TOKEN": TOKEN,
        "KELVIN_AUTH_ADMIN_TOKEN": TOKEN + "-admin",
        "KELVIN_AUTH_READ_TOKEN": TOKEN + "-read",
        "KELVIN_AUTH_TOKEN_FILE": str(work / "tokens.json"),
    }
    full = {**os.environ, **settings, **(env or {})}
    return _start([sys.executable, "-m", "services.cli", "run", "collect-agent"], port, work, full)


def get_json(port: int, path: str, method: str = "GET") -> Any:
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    con.request(method, path)
    resp = con.getresponse()
    body = resp.read()
    con.close()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path} answered {resp.status}: {body[:200]!r}")
    return json.loads(body) if body else None


def influx_query(port: int, q: str) -> Any:
    path = "/query?" + urllib.parse.urlencode({"db": "bench", "q": q, "epoch": "ns"})
    return get_json(port, path)["results"][0]


def wait_until(check: Any, timeout_s: float = 120.0, what: str = "") -> float:
    """Poll ``check()`` until true; returns the time.time() it became true."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return time.time()


def influx_counted_back(server: Any, db: str, measurement: str, expected: int) -> None:
    """Every reading written is in InfluxDB database ``db`` once: it keeps one point per
    series and time, so a lost or a duplicated write shows in the count."""
    doc = server.query(f'SELECT count("value") FROM "{measurement}"', database=db)
    series = doc["results"][0].get("series") or [{"values": [[0, 0]]}]
    stored = int(series[0]["values"][0][1])
    assert stored == expected, f"InfluxDB {db}.{measurement}: stored {stored:,} of {expected:,}"
