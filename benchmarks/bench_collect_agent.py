"""Collect agent end to end: HTTP line protocol and MQTT, each beside the peers a site would run.

1. ``POST /write`` (benchmarks/write_http.py): the agent beside InfluxDB 1.6 and
   VictoriaMetrics, same bodies and client.
2. MQTT: raw-socket publisher -> agent (built-in endpoint) -> SQLite. Beside it,
   in the same run and with the same data: the physical limit of the layout
   (blob inserts in plain sqlite3; the disk's fdatasync), the raw SQLite insert
   rate of the same rows (row per reading, the classic schema), the SQLite
   backend's own ``write()`` (what the agent's writer calls), mosquitto
   delivering the same PUBLISHes to a counting subscriber, and amqtt's broker
   acknowledging them (the alternative for the built-in endpoint). QoS 1
   throughout; the agent runs with its defaults (fsync on every group commit).

Every reading the agent stored is read back from storage and compared with what
was published (count, timestamps, values); any loss or duplicate fails the run.
The load generators run in their own processes so they do not share the agent's
interpreter. Other modules add sections to ``SECTIONS``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import limits, write_http
from benchmarks.loadgen_mqtt import TS0
from services.collect_agent import mqtt_packets as mp
from services.collect_agent.app import create_service
from services.common import codec
from services.common.readings import Batch
from services.common.settings import Config
from services.common.storage import StorageBackend
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage
from tests.support.auth import AUTH_SECTION, MQTT_LOGIN

SENSORS = 1000
SCENARIOS = [  # (label, readings per message, messages full, messages quick)
    ("1 reading", 1, 300_000, 30_000),
    ("100 readings", 100, 30_000, 3_000),
]
AMQTT_MESSAGES = (6_000, 1_500)
GOALS = {1: ("messages/s", 50_000), 100: ("readings/s", 250_000)}


def rows(messages: int, readings: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (sensor index, timestamp, value) rows ``loadgen_mqtt.dcdb_packets`` publishes."""
    i = np.repeat(np.arange(messages, dtype=np.int64), readings)
    k = np.tile(np.arange(readings, dtype=np.int64), messages)
    sensor = i % SENSORS
    ts = TS0 + (i // SENSORS) * readings * 1000 + k * 1000
    return sensor, ts, (i + k).astype(np.float64)


def sensor_names() -> list[str]:
    return [f"/bench/n{s // 100:03d}/s{s % 100:02d}" for s in range(SENSORS)]


async def _loadgen(*args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.loadgen_mqtt", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"loadgen {args[0]} failed ({proc.returncode})")
    return json.loads(out)  # type: ignore[no-any-return]


def _publish_args(port: int, messages: int, readings: int) -> list[str]:
    return ["publish", "--port", str(port), "--messages", str(messages),
            "--readings", str(readings), "--sensors", str(SENSORS)]  # fmt: skip


# --------------------------------------------------------------------------- Kelvin


async def kelvin(
    work: Path,
    messages: int,
    readings: int,
    storage: dict[str, Any],
    probe: bool,
    mark: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """One agent run: ``messages`` of ``readings`` published, until all is stored, then
    every reading counted back. ``mark`` is called with "start" just before the first
    publish and "stored" once the spool is empty (before the count back), so a caller
    can measure what the ingest alone cost."""
    cfg = Config(
        overrides={
            "collect_agent": {"host": "127.0.0.1", "port": 0, "mqtt_port": 0,
                              "spool_dir": str(work / "spool"), "cache_window_s": 60},
            "storage": storage,
            "auth": AUTH_SECTION,  # on, as by default: the load generator logs in with a token
        }
    )  # fmt: skip
    agent = create_service(cfg)
    await agent.start()
    try:
        assert agent.mqtt_port
        login = ["--username", MQTT_LOGIN["username"], "--password", MQTT_LOGIN["password"]]
        if mark is not None:
            mark("start")
        res = await _loadgen(*_publish_args(agent.mqtt_port, messages, readings), *login)
        await agent.spool.wait_empty()
        stored_s = time.time() - res["start"]
        if mark is not None:
            mark("stored")
        assert agent.storage is not None
        await count_back(agent.storage, messages, readings)
        out = {"ack_msgs": res["rate"], "stored_s": stored_s}
        if probe:
            out.update(await _latency(agent.mqtt_port))
        return out
    finally:
        await agent.stop()


async def count_back(storage: StorageBackend, messages: int, readings: int) -> None:
    """Every sensor read back: exactly the readings published, no more, no fewer."""
    sensor, ts, vs = rows(messages, readings)
    order = np.lexsort((ts, sensor))
    sensor, ts, vs = sensor[order], ts[order], vs[order]
    bounds = np.searchsorted(sensor, np.arange(SENSORS + 1))
    names = sensor_names()
    for s in range(min(SENSORS, messages)):
        a, b = int(bounds[s]), int(bounds[s + 1])
        got = await storage.read(names[s], TS0, int(ts.max()) + 1)
        if not (np.array_equal(got.timestamps_ns, ts[a:b]) and np.array_equal(got.values, vs[a:b])):
            raise RuntimeError(
                f"{names[s]}: {len(got)} readings stored, {b - a} published (loss or duplicate)"
            )


async def _latency(port: int, n: int = 300) -> dict[str, float]:
    """Publish -> PUBACK round trips of one client at low load (spool fsync included)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(mp.connect("latency-probe", **MQTT_LOGIN))
    await reader.readexactly(4)
    rtts = []
    for i in range(n):
        pkt = mp.publish("/bench/latency", codec.encode_dcdb([i], [TS0 + i]), 1, i + 1)
        t0 = time.perf_counter()
        writer.write(pkt)
        await reader.readexactly(4)
        rtts.append(time.perf_counter() - t0)
    writer.close()
    q = statistics.quantiles(rtts, n=100)
    return {"rtt_p50_ms": q[49] * 1000, "rtt_p99_ms": q[98] * 1000}


# --------------------------------------------------------------------------- references


def raw_sqlite(work: Path, messages: int, readings: int) -> float:
    """Rows/s inserting the same rows with plain sqlite3 (WAL, 100k-row transactions)."""
    sensor, ts, vs = rows(messages, readings)
    con = sqlite3.connect(work / "raw.sqlite", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(
        "CREATE TABLE readings (sid INTEGER, ts INTEGER, value REAL, PRIMARY KEY (sid, ts)) WITHOUT ROWID"
    )
    t0 = time.perf_counter()
    step = 100_000
    for a in range(0, len(ts), step):
        con.execute("BEGIN")
        con.executemany(
            "INSERT OR REPLACE INTO readings VALUES (?,?,?)",
            zip(
                sensor[a : a + step].tolist(),
                ts[a : a + step].tolist(),
                vs[a : a + step].tolist(),
                strict=True,
            ),
        )
        con.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    con.close()
    return len(ts) / elapsed


async def backend_direct(storage: StorageBackend, messages: int, readings: int) -> float:
    """Readings/s of the backend's ``write`` alone, in the agent writer's batch size."""
    _, ts, vs = rows(messages, readings)
    names = sensor_names()
    per_batch = max(1, 200_000 // readings)
    batches = []
    for a in range(0, messages, per_batch):
        b = min(a + per_batch, messages)
        offsets = np.arange(b - a + 1, dtype=np.int64) * readings
        batches.append(
            Batch([names[i % SENSORS] for i in range(a, b)], offsets,
                  ts[a * readings : b * readings], vs[a * readings : b * readings])
        )  # fmt: skip
    await storage.open()
    t0 = time.perf_counter()
    for batch in batches:
        await storage.write(batch)
    elapsed = time.perf_counter() - t0
    await storage.close()
    return len(ts) / elapsed


def raw_line_protocol(url: str, database: str, messages: int, readings: int) -> float:
    """Points/s POSTing the same rows as line protocol (50k lines per request, one writer)."""
    sensor, ts, vs = rows(messages, readings)
    heads = [f"kelvin,sensor={n} value=" for n in sensor_names()]
    body = [
        f"{heads[s]}{v!r} {t}"
        for s, t, v in zip(sensor.tolist(), ts.tolist(), vs.tolist(), strict=True)
    ]
    chunks = ["\n".join(body[a : a + 50_000]).encode() for a in range(0, len(body), 50_000)]
    u = urllib.parse.urlsplit(url)
    con = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 8086, timeout=60)
    con.request("POST", f"/query?q=CREATE+DATABASE+{database}")
    con.getresponse().read()
    t0 = time.perf_counter()
    for chunk in chunks:
        con.request("POST", f"/write?db={database}&precision=ns", body=chunk)
        resp = con.getresponse()
        resp.read()
        if resp.status != 204:
            raise RuntimeError(f"InfluxDB /write answered {resp.status}")
    elapsed = time.perf_counter() - t0
    con.close()
    return len(body) / elapsed


async def mosquitto(work: Path, messages: int, readings: int) -> float | None:
    """Messages/s from the first publish until a counting subscriber has them all."""
    try:
        from tests.support.servers import Mosquitto

        broker = Mosquitto(work).start()
    except BaseException as exc:  # pytest.skip when mosquitto is missing
        print(f"mosquitto reference skipped: {exc}", file=sys.stderr)
        return None
    try:
        sub = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.loadgen_mqtt", "subscribe", "--port",
            str(broker.port), "--expect", str(messages), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert sub.stdout is not None
        await sub.stdout.readline()  # subscribed
        pub = await _loadgen(*_publish_args(broker.port, messages, readings))
        got = json.loads(await sub.stdout.readline())
        await sub.wait()
        return messages / (got["end"] - pub["start"])
    finally:
        broker.stop()


async def amqtt(messages: int, readings: int) -> float:
    """Messages/s amqtt's broker acknowledges (QoS 1, nobody subscribed)."""
    from tests.support.servers import free_port, wait_port

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.loadgen_mqtt", "amqtt-broker", "--port", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_port, port, "127.0.0.1", 30.0)
        res = await _loadgen(*_publish_args(port, messages, readings), "--window", "1000")
        return float(res["rate"])
    finally:
        proc.kill()
        await proc.wait()


# --------------------------------------------------------------------------- report


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


async def _sqlite_section(quick: bool, notes: list[str]) -> list[str]:
    lines = []
    for label, readings, full, small in SCENARIOS:
        n = small if quick else full
        work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
        try:
            storage = {"sqlite": {"path": str(work / "agent.sqlite")}}
            k = await kelvin(work, n, readings, storage, probe=readings == 1)
            _, ts, vs = rows(n, readings)
            blob = limits.blob_inserts(work / "blob.sqlite", ts, vs)
            sync_p50, sync_p99 = limits.fdatasync_ms(work)
            raw = raw_sqlite(work, n, readings)
            direct = await backend_direct(
                SqliteStorage(SqliteSettings(path=work / "backend.sqlite")), n, readings
            )
            mosq = await mosquitto(work, n, readings)
            amq = await amqtt(AMQTT_MESSAGES[quick], readings) if readings == 1 else None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        stored_msgs = n / k["stored_s"]
        stored_rd = stored_msgs * readings
        lines += _kelvin_rows(label, readings, k, stored_msgs)
        lines += [
            f"| {label} | limit: blob inserts in plain sqlite3 (the layout, nothing else) | "
            f"| {_fmt(blob)} | Kelvin ÷ limit = **{stored_rd / blob:.2f}** |",
            f"| {label} | limit: one fdatasync per commit (p50 {sync_p50:.2f} ms, "
            f"p99 {sync_p99:.2f} ms) | {_fmt(1000 / sync_p50)} commits/s | | |",
            f"| {label} | raw SQLite insert of the same rows (row per reading) | | {_fmt(raw)} "
            f"| Kelvin ÷ raw = **{stored_rd / raw:.2f}** |",
            f"| {label} | SQLite backend `write()` alone | | {_fmt(direct)} "
            f"| Kelvin ÷ backend = {stored_rd / direct:.2f} |",
            f"| {label} | mosquitto → counting subscriber | {_fmt(mosq)} "
            f"| {_fmt(mosq * readings if mosq else None)} "
            f"| {'Kelvin ÷ mosquitto = **%.2f**' % (stored_msgs / mosq) if mosq else ''} |",
        ]
        if amq is not None:
            lines.append(
                f"| {label} | amqtt broker, PUBACK rate (nobody subscribed) | {_fmt(amq)} "
                f"| {_fmt(amq * readings)} | Kelvin ÷ amqtt = **{stored_msgs / amq:.0f}** |"
            )
        unit, goal = GOALS[readings]
        value = stored_msgs if unit == "messages/s" else stored_rd
        ok = value >= goal and (readings == 1 or stored_rd >= raw / 2)
        extra = "" if readings == 1 else f" and ≥ ½ raw SQLite ({_fmt(raw / 2)})"
        notes.append(
            f"- {label}: goal ≥ {goal:,} {unit}{extra}: {_fmt(value)} → **{'met' if ok else 'NOT met'}**"
        )
        if "rtt_p50_ms" in k:
            notes.append(
                f"- ack latency at low load (publish → PUBACK, fsync per commit): "
                f"p50 {k['rtt_p50_ms']:.2f} ms, p99 {k['rtt_p99_ms']:.2f} ms (budget 50 ms)"
            )
    return lines


async def _influx_section(quick: bool) -> list[str]:
    try:
        from services.common.storage.influxdb import InfluxStorage
        from tests.support.influxdb import InfluxDB

        work = Path(tempfile.mkdtemp(prefix="bench-agent-influx-"))
        server = InfluxDB(work).start()
    except BaseException as exc:  # pytest.skip when influxd is missing
        return [f"| | InfluxDB reference skipped: {exc} | | | |"]
    lines = []
    try:
        for label, readings, full, small in SCENARIOS:
            n = (small if quick else full) // 2
            tag = f"{readings}r"
            storage = {
                "backend": "influxdb",
                "influxdb": server.settings(f"agent_{tag}").model_dump(mode="json"),
            }
            k = await kelvin(work, n, readings, storage, probe=False)
            shutil.rmtree(work / "spool", ignore_errors=True)
            raw = await asyncio.to_thread(raw_line_protocol, server.url, f"raw_{tag}", n, readings)
            direct = await backend_direct(
                InfluxStorage(server.settings(f"backend_{tag}")), n, readings
            )
            stored_msgs = n / k["stored_s"]
            stored_rd = stored_msgs * readings
            lines += _kelvin_rows(label, readings, k, stored_msgs, "InfluxDB")
            lines += [
                f"| {label} | raw line-protocol writes of the same rows | | {_fmt(raw)} "
                f"| Kelvin ÷ raw = **{stored_rd / raw:.2f}** |",
                f"| {label} | InfluxDB backend `write()` alone | | {_fmt(direct)} "
                f"| Kelvin ÷ backend = {stored_rd / direct:.2f} |",
            ]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return lines


def _kelvin_rows(
    label: str, readings: int, k: dict[str, float], stored_msgs: float, store: str = "SQLite"
) -> list[str]:
    return [
        f"| {label} | **Kelvin agent → {store}** (first publish → all stored) "
        f"| **{_fmt(stored_msgs)}** | **{_fmt(stored_msgs * readings)}** | |",
        f"| {label} | Kelvin agent, PUBACK rate (spooled, fsync'ed) | {_fmt(k['ack_msgs'])} "
        f"| {_fmt(k['ack_msgs'] * readings)} | |",
    ]


_HEAD = ["| payload | path | messages/s | readings/s | ratio |", "|---|---|---:|---:|---|"]


async def _http(quick: bool) -> str:
    return await asyncio.to_thread(write_http.run, quick)


async def _mqtt_sqlite(quick: bool) -> str:
    notes: list[str] = []
    lines = await _sqlite_section(quick, notes)
    intro = (
        f"{'quick' if quick else 'full'} run; {SENSORS} sensors; QoS 1; 4 publisher connections; "
        f"agent defaults (fsync per group commit, sensor cache on); amqtt measured with "
        f"{AMQTT_MESSAGES[quick]:,} messages; every stored reading counted back.\n\n"
    )
    return intro + "\n".join(_HEAD + lines) + "\n\n" + "\n".join(notes)


async def _mqtt_influx(quick: bool) -> str:
    return "Half the messages.\n\n" + "\n".join(_HEAD + await _influx_section(quick))


async def _mqtt_clickhouse(quick: bool) -> str:
    from benchmarks.clickhouse_cluster import agent_section

    return await asyncio.to_thread(agent_section, quick, kelvin, rows, sensor_names())


SECTIONS: list[tuple[str, Callable[[bool], Awaitable[str]]]] = [
    ("HTTP line protocol (`POST /write`) beside InfluxDB and VictoriaMetrics", _http),
    ("MQTT into SQLite", _mqtt_sqlite),
    ("MQTT into InfluxDB 1.x (Debian influxd)", _mqtt_influx),
    ("MQTT into a ClickHouse cluster (2 shards x 2 replicas + ZooKeeper)", _mqtt_clickhouse),
]
"""(title, section): a backend's benchmark module appends its own here."""


async def _run(quick: bool) -> str:
    out = []
    for title, section in SECTIONS:
        out.append(f"### {title}\n\n{await section(quick)}")
    return "\n\n".join(out)


def main(quick: bool = False) -> str:
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    print(main(quick="--quick" in sys.argv))
