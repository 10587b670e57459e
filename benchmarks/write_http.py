"""HTTP line-protocol ``/write``: Kelvin's collect agent beside InfluxDB and VictoriaMetrics.

The same bodies (``loadgen_http``: readings of one field each, 1,000 lines per
request, over 10k series) and the same client (4 keep-alive connections, its
own process) for every server, each started fresh from its package for each
run. Measured per run: readings/s from the first request to the last answer,
the server's CPU seconds per 1M readings (/proc, the whole process), and for
Kelvin also until every reading is in storage. Then every reading is counted
back from the server's storage and compared with what was sent (count,
series, timestamps, values): a run with a missing, extra or wrong reading fails.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import peers
from benchmarks.loadgen_http import FIELD, MEASUREMENT, TS0, expected, series_tags

SERIES = 10_000
PER_BODY = 1_000


def _load(port: int, path: str, readings: int, token: str | None = None) -> dict[str, Any]:
    auth = ["--header", f"Authorization: Bearer {token}"] if token else []
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.loadgen_http", "--port", str(port), "--path", path,
         "--readings", str(readings), "--series", str(SERIES), "--per-body", str(PER_BODY),
         *auth],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    import json

    res: dict[str, Any] = json.loads(out.stdout)
    if set(res["statuses"]) != {"204"}:
        raise RuntimeError(f"{path}: answers {res['statuses']}: {res['errors'][:1]}")
    return res


def _kelvin_names() -> list[str]:
    return [f"/influx/{MEASUREMENT}/{t.replace('host=', '').replace(',sensor=', '/')}/{FIELD}"
            for t in series_tags(SERIES)]  # fmt: skip


async def _count_kelvin(db: Path, readings: int) -> int:
    """Every sensor read back from the agent's SQLite file; returns the readings found."""
    from services.common.storage.settings import SqliteSettings
    from services.common.storage.sqlite import SqliteStorage

    sensor, ts, vs = expected(readings, SERIES)
    st = SqliteStorage(SqliteSettings(path=db))
    await st.open()
    found = 0
    try:
        names = _kelvin_names()
        for s in range(SERIES):
            want = sensor == s
            got = await st.read(names[s], TS0, int(ts.max()) + 1)
            if not (
                np.array_equal(got.timestamps_ns, ts[want]) and np.array_equal(got.values, vs[want])
            ):
                raise RuntimeError(
                    f"{names[s]}: {len(got)} readings stored, {int(want.sum())} sent"
                )
            found += len(got)
    finally:
        await st.close()
    return found


def kelvin(work: Path, readings: int) -> dict[str, float]:
    import asyncio

    agent = peers.kelvin_agent(work)
    try:
        c0 = peers.cpu_s(agent.pid)
        res = _load(agent.port, "/write", readings, peers.TOKEN)
        c_ack = peers.cpu_s(agent.pid)
        stored_at = peers.wait_until(
            lambda: peers.get_json(agent.port, "/api/v1/stats")["readings_written"] >= readings,
            what="the agent's writer",
        )
        c_stored = peers.cpu_s(agent.pid)
    finally:
        agent.proc.terminate()
        agent.proc.wait(60)
    try:
        found = asyncio.run(_count_kelvin(work / "kelvin.sqlite", readings))
    finally:
        agent.stop()
    return {
        "rate": readings / res["seconds"],
        "stored_rate": readings / (stored_at - res["start"]),
        "cpu": (c_ack - c0) / readings * 1e6,
        "cpu_stored": (c_stored - c0) / readings * 1e6,
        "found": found,
    }


def influx(work: Path, readings: int) -> dict[str, float]:
    server = peers.influxdb(work)
    try:
        c0 = peers.cpu_s(server.pid)
        res = _load(server.port, "/write?db=bench&precision=ns", readings)
        c1 = peers.cpu_s(server.pid)
        sensor, _, vs = expected(readings, SERIES)
        got = peers.influx_query(
            server.port, f"SELECT COUNT({FIELD}), SUM({FIELD}) FROM {MEASUREMENT} GROUP BY *"
        )
        per = {tuple(sorted(s["tags"].items())): s["values"][0][1:] for s in got.get("series", [])}
        want_n = np.bincount(sensor, minlength=SERIES)
        want_sum = np.bincount(sensor, weights=vs, minlength=SERIES)
        tags = series_tags(SERIES)
        found = 0
        for s in range(SERIES):
            host, sens = (t.split("=")[1] for t in tags[s].split(","))
            n, total = per.get((("host", host), ("sensor", sens)), (0, 0.0))
            if n != want_n[s] or abs(total - want_sum[s]) > 1e-6 * max(1.0, abs(want_sum[s])):
                raise RuntimeError(
                    f"InfluxDB series {tags[s]}: {n} points stored, {want_n[s]} sent"
                )
            found += n
    finally:
        server.stop()
    return {"rate": readings / res["seconds"], "cpu": (c1 - c0) / readings * 1e6, "found": found}


def victoria(work: Path, readings: int) -> dict[str, float]:
    server = peers.victoria_metrics(work)
    try:
        c0 = peers.cpu_s(server.pid)
        res = _load(server.port, "/write", readings)
        c1 = peers.cpu_s(server.pid)
        peers.get_json(server.port, "/internal/force_flush")
        import http.client
        import json

        con = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        con.request("GET", f"/api/v1/export?match[]={MEASUREMENT}_{FIELD}")
        lines = con.getresponse().read().splitlines()
        con.close()
        sensor, ts, vs = expected(readings, SERIES)
        tags = series_tags(SERIES)
        index = {tuple(t.split("=")[1] for t in tag.split(",")): s for s, tag in enumerate(tags)}
        found = 0
        for raw in lines:
            row = json.loads(raw)
            s = index[(row["metric"]["host"], row["metric"]["sensor"])]
            want = sensor == s
            got_ts = np.array(row["timestamps"], np.int64) * 1_000_000  # VictoriaMetrics keeps ms
            order = np.argsort(got_ts, kind="stable")
            if not (np.array_equal(got_ts[order], ts[want])
                    and np.array_equal(np.array(row["values"])[order], vs[want])):  # fmt: skip
                raise RuntimeError(
                    f"VictoriaMetrics {tags[s]}: {len(got_ts)} stored, {int(want.sum())} sent"
                )
            found += len(got_ts)
    finally:
        server.stop()
    return {"rate": readings / res["seconds"], "cpu": (c1 - c0) / readings * 1e6, "found": found}


def run(quick: bool) -> str:
    readings = 100_000 if quick else 1_000_000
    runs = 1 if quick else 3
    results: dict[str, list[dict[str, float]]] = {"kelvin": [], "influxdb": [], "victoria": []}
    for _ in range(runs):  # interleaved: the machine's speed drifts
        for name, fn in (("kelvin", kelvin), ("influxdb", influx), ("victoria", victoria)):
            work = Path(tempfile.mkdtemp(prefix=f"bench-write-{name}-"))
            try:
                got = fn(work, readings)
            except Exception as exc:  # a missing peer: say so, keep the others
                if name == "kelvin":
                    raise
                print(f"{name} skipped: {exc}", file=sys.stderr)
                continue
            if got["found"] != readings:
                raise RuntimeError(f"{name}: {got['found']:,} readings stored of {readings:,} sent")
            results[name].append(got)
            time.sleep(0.5)

    def med(name: str, key: str) -> float | None:
        vals = [r[key] for r in results[name] if key in r]
        return statistics.median(vals) if vals else None

    k = med("kelvin", "rate") or 0.0
    rows = [
        ("Kelvin agent → SQLite, 204 rate", k, med("kelvin", "cpu"), peers.ACKS["kelvin"]),
        ("Kelvin agent, until all is in storage", med("kelvin", "stored_rate"),
         med("kelvin", "cpu_stored"), "every reading in SQLite"),
        ("InfluxDB 1.6", med("influxdb", "rate"), med("influxdb", "cpu"), peers.ACKS["influxdb"]),
        ("VictoriaMetrics", med("victoria", "rate"), med("victoria", "cpu"), peers.ACKS["victoriametrics"]),
    ]  # fmt: skip
    out = [
        f"{readings:,} readings, {PER_BODY:,} lines per request, {SERIES:,} series, 4 connections; "
        f"median of {runs} run(s); every reading counted back from each server's storage.",
        "",
        "| server | readings/s | Kelvin ÷ it | CPU-s per 1M readings | acknowledged when |",
        "|---|---:|---:|---:|---|",
    ]
    for label, rate, cpu, ack in rows:
        if rate is None:
            out.append(f"| {label} | n/a | | | {ack} |")
            continue
        ratio = "" if label.startswith("Kelvin") else f"{k / rate:.2f}"
        out.append(f"| {label} | {rate:,.0f} | {ratio} | {cpu:.2f} | {ack} |")
    goal_influx = med("influxdb", "rate")
    cpu = med("kelvin", "cpu") or 0.0
    met = k >= 1_000_000 and (goal_influx is None or k >= 1.3 * goal_influx) and cpu <= 1.0
    out += [
        "",
        f"- goal ≥ 1M readings/s, ≥ 1.3x InfluxDB, ≤ 1 CPU-s per 1M: {k:,.0f}/s, "
        + (f"{k / goal_influx:.2f}x InfluxDB, " if goal_influx else "")
        + f"{cpu:.2f} CPU-s → **{'met' if met else 'NOT met'}**",
    ]
    return "\n".join(out)
