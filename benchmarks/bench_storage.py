"""Storage: each backend beside its raw driver doing the same work, in the same run.

- SQLite: Kelvin's chunked layout vs ``sqlite3.executemany`` row per reading
  (``WITHOUT ROWID`` table keyed by sensor id and time, WAL, synchronous=NORMAL,
  sensor ids handed to the raw side for free).
- InfluxDB (a real ``influxd`` on loopback): Kelvin's backend vs plain HTTP
  line-protocol POSTs (f-strings, ``http.client``) and a plain InfluxQL GET
  (JSON decoded into arrays; and CSV bytes alone, the server's floor).

Inserts: batches of 10k readings, spread over 10k sensors (one reading each)
and over 10 sensors (1000 each); Kelvin's figure includes compacting
everything it staged. Beside the row-per-reading reference, the physical limit
of Kelvin's layout: the same readings as blob rows in plain sqlite3
(benchmarks/limits.py). Every insert is counted back from storage (a loss or a duplicate fails the run).
Reads: one sensor, 1M points (best of 3). Other
backends' modules add their cases to ``CASES``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import limits
from benchmarks.peers import influx_counted_back
from services.common.readings import Batch
from services.common.storage import chunks
from services.common.storage.influxdb import InfluxStorage
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import SqliteStorage

T0 = 1_700_000_000 * 10**9
S = 10**9
WITHIN = ">= 0.67 (within 1.5x)"


@dataclass
class Row:
    backend: str
    case: str
    kelvin: float
    reference: float
    ref_name: str
    goal: str
    unit: str = "readings/s"


def batches(n: int, sensors: int, per_batch: int = 10_000) -> Iterator[Batch]:
    """``n`` readings in batches of ``per_batch``: each batch has ``per_batch // sensors``
    consecutive readings (1 s apart) of every sensor. Values look like sensors: 2 decimals."""
    names = [f"/dc/r{i // 100}/n{i % 100}/power" for i in range(sensors)]
    per = per_batch // sensors
    rng = np.random.default_rng(7)
    offsets = np.arange(0, per_batch + 1, per, dtype=np.int64)
    for k in range(n // per_batch):
        ts = np.tile(T0 + (k * per + np.arange(per, dtype=np.int64)) * S, sensors)
        vs = np.round(rng.normal(200.0, 20.0, per_batch), 2)
        yield Batch(names, offsets, ts, vs)


def rate(n: int, fn: Callable[..., object], *args: object) -> float:
    """``n`` / seconds taken by ``fn(*args)``."""
    t = time.perf_counter()
    fn(*args)
    return n / (time.perf_counter() - t)


def best_rate(n: int, fn: Callable[..., object], *args: object) -> float:
    return max(rate(n, fn, *args) for _ in range(3))


# ---------------------------------------------------------------------- SQLite
def _raw_sqlite(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute(
        "CREATE TABLE readings (sid INTEGER NOT NULL, ts INTEGER NOT NULL, value REAL, "
        "PRIMARY KEY (sid, ts)) WITHOUT ROWID"
    )
    return con


def raw_sqlite_insert(path: Path, data: list[Batch]) -> None:
    con = _raw_sqlite(path)
    ids = {name: i for i, name in enumerate(data[0].sensors)}
    for b in data:
        sids = np.repeat(np.array([ids[s] for s in b.sensors]), b.counts)
        con.execute("BEGIN")
        con.executemany(
            "INSERT OR REPLACE INTO readings VALUES (?,?,?)",
            zip(sids.tolist(), b.timestamps_ns.tolist(), b.values.tolist(), strict=True),
        )
        con.execute("COMMIT")
    con.close()


def raw_sqlite_read(path: Path, sid: int, n: int) -> None:
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT ts, value FROM readings WHERE sid=? AND ts>=? AND ts<? ORDER BY ts",
        (sid, T0, T0 + n * S),
    ).fetchall()
    ts = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    vs = np.fromiter((r[1] for r in rows), np.float64, len(rows))
    assert ts.shape[0] == vs.shape[0] == n
    con.close()


async def kelvin_sqlite_insert(path: Path, data: list[Batch], seal: int | None = None) -> None:
    st = SqliteStorage(SqliteSettings(path=path))
    if seal is not None:
        st.store.seal_encoding = seal
    await st.open()
    for b in data:
        await st.write(b)
    await st.compact()
    stored = (await st.stats())["readings"]
    await st.close()
    expected = sum(len(b) for b in data)
    assert stored == expected, f"SQLite stored {stored:,} of {expected:,} readings"


async def kelvin_sqlite_read(path: Path, n: int, repeat: int = 3) -> tuple[float, float]:
    """(best points/s, stored bytes per reading)."""
    st = SqliteStorage(SqliteSettings(path=path))
    await st.open()
    size = float((await st.stats())["bytes_per_reading"])
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        s = await st.read("/dc/r0/n0/power", T0, T0 + n * S)
        best = max(best, n / (time.perf_counter() - t))
        assert len(s) == n
    await st.close()
    return best, size


def sqlite_cases(tmp: Path, n_insert: int, n_read: int) -> list[Row]:
    rows = []
    for sensors, label in ((10_000, "10k sensors"), (10, "10 sensors")):
        data = list(batches(n_insert, sensors))
        k = rate(n_insert, asyncio.run, kelvin_sqlite_insert(tmp / f"k{sensors}.db", data))
        r = rate(n_insert, raw_sqlite_insert, tmp / f"r{sensors}.db", data)
        goal = ">= 500k/s" if sensors == 10_000 else ""
        rows.append(Row("SQLite", f"insert, {label}, batches of 10k", k, r, "executemany", goal))
        ts = np.concatenate([b.timestamps_ns for b in data])
        vs = np.concatenate([b.values for b in data])
        blob = limits.blob_inserts(tmp / f"blob{sensors}.db", ts, vs)
        rows.append(
            Row(
                "SQLite",
                f"insert, {label}: the layout's limit",
                k,
                blob,
                "blob rows, plain sqlite3",
                "",
            )
        )
    one = list(batches(n_read, 1))
    for enc, name in ((chunks.ZLIB, "zlib (default)"), (chunks.RAW, "raw")):
        db = tmp / f"read-{enc}.db"
        asyncio.run(kelvin_sqlite_insert(db, one, seal=enc))
        k, size = asyncio.run(kelvin_sqlite_read(db, n_read))
        if enc == chunks.ZLIB:
            raw_sqlite_insert(tmp / "read-raw.db", one)
            r = best_rate(n_read, raw_sqlite_read, tmp / "read-raw.db", 0, n_read)
        rows.append(
            Row(
                "SQLite",
                f"read 1 sensor, {n_read // 1000}k points, sealed chunks {name}, "
                f"{size:.1f} B/reading",
                k,
                r,
                "SELECT + fetchall",
                ">= 5M/s",
                "points/s",
            )
        )
    return rows


# ---------------------------------------------------------------------- InfluxDB
def raw_influx_insert(port: int, db: str, data: list[Batch]) -> None:
    con = http.client.HTTPConnection("127.0.0.1", port)
    path = f"/write?db={db}&precision=ns"
    for b in data:
        per = [s for s, c in zip(b.sensors, b.counts.tolist(), strict=True) for _ in range(c)]
        body = "".join(
            f"raw,sensor={s} value={v} {t}\n"
            for s, v, t in zip(per, b.values.tolist(), b.timestamps_ns.tolist(), strict=True)
        )
        con.request("POST", path, body.encode())
        resp = con.getresponse()
        resp.read()
        assert resp.status == 204, resp.status
    con.close()


def raw_influx_read(port: int, db: str, n: int, accept: str) -> None:
    q = f"SELECT value FROM raw WHERE sensor='/dc/r0/n0/power' AND time >= {T0} AND time < {T0 + n * S}"
    params = urllib.parse.urlencode({"db": db, "q": q, "epoch": "ns"})
    con = http.client.HTTPConnection("127.0.0.1", port)
    con.request("GET", f"/query?{params}", headers={"Accept": accept})
    body = con.getresponse().read()
    con.close()
    if accept == "application/json":
        values = json.loads(body)["results"][0]["series"][0]["values"]
        ts = np.array([v[0] for v in values], dtype=np.int64)
        vs = np.array([v[1] for v in values], dtype=np.float64)
        assert ts.shape[0] == vs.shape[0] == n


async def kelvin_influx_insert(backend: InfluxStorage, data: list[Batch]) -> None:
    for b in data:
        await backend.write(b)


def influx_cases(tmp: Path, n_insert: int, n_read: int) -> list[Row]:
    from tests.support.influxdb import InfluxDB

    server = InfluxDB(tmp / "influx").start()
    dbs = iter(range(100))

    def fresh() -> tuple[InfluxStorage, str]:
        db = f"bench{next(dbs)}"
        server.query(f"CREATE DATABASE {db}")
        return InfluxStorage(server.settings(db)), db

    async def with_backend(backend: InfluxStorage, work: Callable[[], object]) -> float:
        await backend.open()
        try:
            return await work()  # type: ignore[no-any-return,misc]
        finally:
            await backend.close()

    rows = []
    try:
        for sensors, label in ((10_000, "10k sensors"), (10, "10 sensors")):
            data = list(batches(n_insert, sensors))
            k = r = 0.0
            for _ in range(2):  # interleaved, best of 2: the server's speed drifts
                backend, _ = fresh()

                async def timed(
                    backend: InfluxStorage = backend, data: list[Batch] = data
                ) -> float:
                    t = time.perf_counter()
                    await kelvin_influx_insert(backend, data)
                    return n_insert / (time.perf_counter() - t)

                k = max(k, asyncio.run(with_backend(backend, timed)))
                influx_counted_back(server, backend.settings.database, "kelvin", n_insert)
                _, raw_db = fresh()
                r = max(r, rate(n_insert, raw_influx_insert, server.port, raw_db, data))
                influx_counted_back(server, raw_db, "raw", n_insert)
            rows.append(
                Row("InfluxDB", f"insert, {label}, batches of 10k", k, r, "HTTP POST", WITHIN)
            )
        one = list(batches(n_read, 1))
        backend, db = fresh()

        async def load_and_read() -> float:
            await kelvin_influx_insert(backend, one)
            best = 0.0
            for _ in range(3):
                t = time.perf_counter()
                s = await backend.read("/dc/r0/n0/power", T0, T0 + n_read * S)
                best = max(best, n_read / (time.perf_counter() - t))
                assert len(s) == n_read
            return best

        k = asyncio.run(with_backend(backend, load_and_read))
        raw_influx_insert(server.port, db, one)
        for accept, what in (
            ("application/json", "GET JSON + decode"),
            ("application/csv", "GET CSV, bytes only"),
        ):
            r = best_rate(n_read, raw_influx_read, server.port, db, n_read, accept)
            rows.append(
                Row(
                    "InfluxDB",
                    f"read 1 sensor, {n_read // 1000}k points",
                    k,
                    r,
                    what,
                    WITHIN,
                    "points/s",
                )
            )
    finally:
        server.stop()
    return rows


# ---------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


CASES: list[Callable[[Path, bool], list[Row]]] = [
    lambda tmp, quick: sqlite_cases(
        tmp, *((200_000, 100_000) if quick else (2_000_000, 1_000_000))
    ),
    lambda tmp, quick: influx_cases(
        tmp, *((100_000, 100_000) if quick else (1_000_000, 1_000_000))
    ),
]
"""Each backend's cases (its own temporary directory, quick or not): a module appends its own."""


def main(quick: bool) -> str:
    n_insert = 200_000 if quick else 2_000_000
    n_read = 100_000 if quick else 1_000_000
    influx_insert = 100_000 if quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="kelvin-bench-storage-") as d:
        tmp = Path(d)
        rows: list[Row] = []
        for i, case in enumerate(CASES):
            (tmp / str(i)).mkdir()
            rows += case(tmp / str(i), quick)
    lines = [
        "| backend | case | Kelvin | reference | reference is | Kelvin / ref | goal |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.backend} | {r.case} | {_fmt(r.kelvin)} {r.unit} | {_fmt(r.reference)} | "
            f"{r.ref_name} | {r.kelvin / r.reference:.2f} | {r.goal} |"
        )
    lines.append("")
    lines.append(
        f"SQLite inserts: {n_insert:,} readings per case; InfluxDB inserts: "
        f"{influx_insert:,}; reads: {n_read:,} points, best of 3."
    )
    from benchmarks.clickhouse_cluster import storage_section

    lines += ["", "### ClickHouse cluster (2 shards x 2 replicas + ZooKeeper)", ""]
    lines.append(storage_section(quick))
    return "\n".join(lines)
