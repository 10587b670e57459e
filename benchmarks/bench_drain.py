"""SIGTERM drain rate: how fast a stopping collect agent empties its spool into storage.

A real ``kelvin run collect-agent`` process with a real ``influxd`` (the chart's
storage): with InfluxDB stopped, a raw-socket publisher fills the spool with
acknowledged readings; then InfluxDB starts again and

- *normal*: the agent keeps running; time from InfluxDB answering to an empty spool;
- *SIGTERM*: the agent gets SIGTERM first (it stops taking data and drains), time from
  InfluxDB answering to the agent's "drained:" log line (its spool empty), and to its
  exit (0);

beside the reference of the same layout: the InfluxDB backend's own ``write()`` of the
same rows from one process in 200k-reading batches (what the agent's writer calls,
without a spool).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.loadgen_mqtt import TS0, Login, dcdb_packets, publish
from benchmarks.peers import influx_counted_back
from services.common.readings import Batch
from tests.support.auth import MQTT_LOGIN

SENSORS = 1000
PER_MESSAGE = 100


def _stats(agent: Any) -> dict[str, Any]:
    url = f"http://127.0.0.1:{agent.http_port}/api/v1/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _fill(agent: Any, messages: int) -> int:
    packets = dcdb_packets(messages, PER_MESSAGE, SENSORS)
    publish(agent.mqtt_port, packets, connections=4, login=Login(**MQTT_LOGIN))
    readings = messages * PER_MESSAGE
    while _stats(agent)["spool"]["pending_readings"] < readings:
        time.sleep(0.05)
    return readings


def _drained_at(log: Path) -> float:
    """Wall-clock time of the agent's "drained:" log line (its spool empty)."""
    line = next(x for x in log.read_text().splitlines() if " drained: " in x)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _run(
    kind: str, workdir: Path, server: Any, messages: int, run: int
) -> tuple[int, float, float | None]:
    from tests.collect_agent.agent_proc import AgentProcess

    influx = server.settings(f"drain_{kind}_{run}", retries=0, timeout_s=30)
    agent = AgentProcess(
        workdir,
        f"{kind}-{run}",
        storage={"backend": "influxdb", "influxdb": influx.model_dump(mode="json")},
        writer_retry_max_s=0.05,
        drain_timeout_s=120,
        scales_wait_s=0,
        spool_max_bytes=4 << 30,
    ).start()
    try:
        server.stop()
        readings = _fill(agent, messages)
        assert agent.proc is not None
        if kind == "sigterm":
            agent.proc.send_signal(signal.SIGTERM)
            while "draining: taking no new data" not in agent.log.read_text():
                time.sleep(0.02)
        server.start()
        t0, wall0 = time.perf_counter(), time.time()
        if kind == "sigterm":
            if agent.proc.wait(300) != 0:
                raise RuntimeError(f"agent exited {agent.proc.returncode}")
            exited = time.perf_counter() - t0
            return readings, _drained_at(agent.log) - wall0, exited
        while _stats(agent)["spool"]["pending_readings"]:
            time.sleep(0.05)  # polling more often would load the agent it measures
        return readings, time.perf_counter() - t0, None
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.kill9()


async def _direct(server: Any, messages: int, run: int) -> tuple[int, float]:
    from services.common.storage.influxdb import InfluxStorage

    storage = InfluxStorage(server.settings(f"drain_direct_{run}", retries=0, timeout_s=30))
    await storage.open()
    try:
        per_sensor = messages // SENSORS * PER_MESSAGE
        ts = TS0 + np.arange(per_sensor, dtype=np.int64) * 1000
        names = [f"/bench/n{s // 100:03d}/s{s % 100:02d}" for s in range(SENSORS)]
        batches = [
            Batch.concat([Batch.single(n, ts, np.arange(per_sensor, dtype=float)) for n in chunk])
            for chunk in (names[i : i + 200] for i in range(0, SENSORS, 200))
        ]
        t0 = time.perf_counter()
        for b in batches:
            await storage.write(b)
        return sum(len(b) for b in batches), time.perf_counter() - t0
    finally:
        await storage.close()


def main(quick: bool = False) -> str:
    try:
        from tests.support.influxdb import InfluxDB
    except BaseException as exc:  # pytest.skip when influxd is missing
        return f"skipped: {exc}"
    messages = 2_000 if quick else 20_000  # x 100 readings
    rows = []
    with tempfile.TemporaryDirectory(prefix="kelvin-bench-drain-") as tmp:
        work = Path(tmp)
        server = InfluxDB(work).start()
        try:
            # Each path twice, in the order A B C C B A (InfluxDB compacts what the run
            # before wrote), each into its own database; the table shows the medians.
            times: dict[str, list[float]] = {}
            for i, kind in enumerate(("direct", "normal", "sigterm") * 2):
                kind = kind if i < 3 else ("sigterm", "normal", "direct")[i - 3]
                if kind == "direct":
                    readings, seconds = asyncio.run(_direct(server, messages, i))
                    influx_counted_back(server, f"drain_direct_{i}", "kelvin", readings)
                    times.setdefault(kind, []).append(seconds)
                    continue
                readings, seconds, exited = _run(kind, work, server, messages, i)
                influx_counted_back(server, f"drain_{kind}_{i}", "kelvin", readings)
                times.setdefault(kind, []).append(seconds)
                if exited is not None:
                    times.setdefault("exit", []).append(exited)
            for kind in ("normal", "sigterm", "exit", "direct"):
                rows.append((kind, readings, statistics.median(times[kind])))
        finally:
            server.stop()
    limit = rows[-1][1] / rows[-1][2]  # the reference: the direct write
    what = {
        "normal": "spool → InfluxDB, agent running (backlog after an outage)",
        "sigterm": "spool → InfluxDB during the SIGTERM drain (to the spool empty)",
        "exit": "the same, to the process's exit (HTTP, spool and storage closed)",
        "direct": "reference: the InfluxDB backend's `write()`, same rows, no spool",
    }
    out = [
        "| path | readings | seconds | readings/s | / reference |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, readings, seconds in rows:
        rate = readings / seconds
        out.append(
            f"| {what[kind]} | {readings:,} | {seconds:.2f} | {rate:,.0f} | {rate / limit:.2f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv))
