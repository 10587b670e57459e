"""The embedded default backend: one SQLite file in WAL mode, no server to run.

One writer connection on a dedicated thread (SQLite allows one writer at a
time); reads use their own connection on another thread so that a long range
read never waits for ingest. Readings are one row per (sensor id, timestamp),
``WITHOUT ROWID`` so the primary key is the clustered index a range scan walks.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from services.common import names
from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch, Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import Child, StorageBackend, VirtualResults
from services.common.storage.settings import SqliteSettings

T = TypeVar("T")

SCHEMA_VERSION = 1

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS sensors (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, metadata TEXT)""",
    """CREATE TABLE IF NOT EXISTS readings (
        sid INTEGER NOT NULL, ts INTEGER NOT NULL, value REAL,
        PRIMARY KEY (sid, ts)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writes (
        sid INTEGER NOT NULL, written_at INTEGER NOT NULL, min_ts INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS writes_at ON writes (written_at)",
    "CREATE TABLE IF NOT EXISTS virtual_defs (name TEXT PRIMARY KEY, definition TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS virtual_ranges (
        name TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
        computed_at INTEGER NOT NULL, PRIMARY KEY (name, start_ns))""",
    """CREATE TABLE IF NOT EXISTS virtual_points (
        name TEXT NOT NULL, ts INTEGER NOT NULL, value REAL,
        PRIMARY KEY (name, ts)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS jobs (
        domain_id TEXT NOT NULL, job_id TEXT NOT NULL, user_id TEXT,
        start_ns INTEGER NOT NULL, end_ns INTEGER, nodes TEXT NOT NULL,
        PRIMARY KEY (domain_id, job_id))""",
]


def _wrap(exc: sqlite3.Error) -> Exception:
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and (
        "locked" in msg or "busy" in msg or "disk I/O" in msg or "unable to open" in msg
    ):
        return RetryableStorageError(f"sqlite: {msg}")
    if isinstance(exc, sqlite3.OperationalError) and "full" in msg:
        return RetryableStorageError(f"sqlite: {msg} (free disk space)")
    return PermanentStorageError(f"sqlite: {msg}")


class SqliteStorage(StorageBackend):
    """SQLite backend (see module docstring)."""

    kind: ClassVar[str] = "sqlite"

    def __init__(self, settings: SqliteSettings | None = None) -> None:
        self.settings = settings or SqliteSettings()
        self.path = Path(self.settings.path)
        self._wx = ThreadPoolExecutor(1, thread_name_prefix="sqlite-w")
        self._rx = ThreadPoolExecutor(1, thread_name_prefix="sqlite-r")
        self._w: sqlite3.Connection | None = None
        self._r: sqlite3.Connection | None = None
        self._sids: dict[str, int] = {}

    # ------------------------------------------------------------------ plumbing
    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        con.execute(f"PRAGMA busy_timeout={int(self.settings.busy_timeout_ms)}")
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA synchronous={self.settings.synchronous}")
        return con

    async def _call(self, pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        def guarded() -> T:
            try:
                return fn()
            except sqlite3.Error as exc:
                raise _wrap(exc) from exc

        return await asyncio.get_running_loop().run_in_executor(pool, guarded)

    async def _wcall(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._w is None:
            raise RetryableStorageError("sqlite storage is not open")
        con = self._w
        return await self._call(self._wx, lambda: fn(con))

    async def _rcall(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._r is None:
            raise RetryableStorageError("sqlite storage is not open")
        con = self._r
        return await self._call(self._rx, lambda: fn(con))

    async def open(self) -> None:
        def setup() -> tuple[sqlite3.Connection, sqlite3.Connection]:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            w = self._connect()
            for stmt in _SCHEMA:
                w.execute(stmt)
            row = w.execute("SELECT value FROM meta_kv WHERE key='schema_version'").fetchone()
            if row is None:
                w.execute(
                    "INSERT INTO meta_kv VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise PermanentStorageError(
                    f"sqlite: {self.path} has schema version {row[0]}, newer than this Kelvin "
                    f"({SCHEMA_VERSION}); upgrade Kelvin"
                )
            return w, self._connect()

        try:
            self._w, self._r = await self._call(self._wx, setup)
        except OSError as exc:
            raise PermanentStorageError(f"sqlite: cannot create {self.path}: {exc}") from exc

    async def close(self) -> None:
        for con, pool in ((self._w, self._wx), (self._r, self._rx)):
            if con is not None:
                await asyncio.get_running_loop().run_in_executor(pool, con.close)
        self._w = self._r = None
        self._wx.shutdown(wait=True)
        self._rx.shutdown(wait=True)
        self._wx = ThreadPoolExecutor(1, thread_name_prefix="sqlite-w")
        self._rx = ThreadPoolExecutor(1, thread_name_prefix="sqlite-r")

    async def ping(self) -> bool:
        try:
            await self._rcall(lambda c: c.execute("SELECT 1").fetchone())
            return True
        except Exception:
            return False

    def _sid(self, con: sqlite3.Connection, name: str, create: bool) -> int | None:
        sid = self._sids.get(name)
        if sid is not None:
            return sid
        row = con.execute("SELECT id FROM sensors WHERE name=?", (name,)).fetchone()
        if row is None:
            if not create:
                return None
            sid = int(
                con.execute(
                    "INSERT INTO sensors(name) VALUES (?) RETURNING id", (name,)
                ).fetchone()[0]
            )
        else:
            sid = int(row[0])
        if create:
            self._sids[name] = sid
        return sid

    # ------------------------------------------------------------------ readings
    async def write(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        for s in set(batch.sensors):
            names.validate(s)

        def tx(con: sqlite3.Connection) -> None:
            now = time.time_ns()
            con.execute("BEGIN IMMEDIATE")
            try:
                sids = np.fromiter(
                    (self._sid(con, s, True) for s in batch.sensors),
                    dtype=np.int64,
                    count=batch.series_count,
                )
                per_reading = np.repeat(sids, batch.counts)
                rows = zip(
                    per_reading.tolist(),
                    batch.timestamps_ns.tolist(),
                    _nan_to_none(batch.values),
                    strict=True,
                )
                con.executemany("INSERT OR REPLACE INTO readings VALUES (?,?,?)", rows)
                mins: dict[int, int] = {}
                for sid, s in zip(sids.tolist(), batch, strict=True):
                    if len(s):
                        m = int(s.timestamps_ns.min())
                        mins[sid] = min(m, mins.get(sid, m))
                con.executemany(
                    "INSERT INTO writes VALUES (?,?,?)", [(k, now, v) for k, v in mins.items()]
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                self._sids.clear()  # ids created in the rolled-back transaction are gone
                raise

        await self._wcall(tx)

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        def q(con: sqlite3.Connection) -> Series:
            row = con.execute("SELECT id FROM sensors WHERE name=?", (sensor,)).fetchone()
            if row is None:
                return Series.empty(sensor)
            cur = con.execute(
                "SELECT ts, value FROM readings WHERE sid=? AND ts>=? AND ts<? ORDER BY ts",
                (row[0], start_ns, end_ns),
            )
            data = cur.fetchall()
            if not data:
                return Series.empty(sensor)
            ts = np.fromiter((r[0] for r in data), dtype=np.int64, count=len(data))
            vs = np.fromiter(
                (np.nan if r[1] is None else r[1] for r in data), dtype=np.float64, count=len(data)
            )
            return Series(sensor, ts, vs)

        return await self._rcall(q)

    async def latest(self, sensor: str) -> tuple[int, float] | None:
        def q(con: sqlite3.Connection) -> tuple[int, float] | None:
            row = con.execute(
                "SELECT r.ts, r.value FROM readings r JOIN sensors s ON s.id=r.sid "
                "WHERE s.name=? ORDER BY r.ts DESC LIMIT 1",
                (sensor,),
            ).fetchone()
            if row is None:
                return None
            return int(row[0]), float("nan") if row[1] is None else float(row[1])

        return await self._rcall(q)

    # ------------------------------------------------------------------ hierarchy
    async def has_sensor(self, sensor: str) -> bool:
        return await self._rcall(
            lambda c: (
                c.execute("SELECT 1 FROM sensors WHERE name=?", (sensor,)).fetchone() is not None
            )
        )

    async def sensors(self, prefix: str = "/") -> list[str]:
        def q(con: sqlite3.Connection) -> list[str]:
            if prefix == "/":
                rows = con.execute("SELECT name FROM sensors ORDER BY name").fetchall()
            else:
                rows = con.execute(
                    "SELECT name FROM sensors WHERE name=? OR (name>=? AND name<?) ORDER BY name",
                    (prefix, prefix + "/", prefix + "0"),  # '0' sorts right after '/'
                ).fetchall()
            return [r[0] for r in rows]

        return await self._rcall(q)

    async def children(self, prefix: str = "/") -> list[Child]:
        all_names = await self.sensors(prefix)
        kids: dict[str, list[bool]] = {}
        for n in all_names:
            c = names.child_of(n, prefix)
            if c is None:
                continue
            entry = kids.setdefault(c, [False, False])
            if n == c:
                entry[0] = True
            else:
                entry[1] = True
        return [Child(k, v[0], v[1]) for k, v in sorted(kids.items())]

    # ------------------------------------------------------------------ metadata
    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        def q(con: sqlite3.Connection) -> SensorMetadata | None:
            row = con.execute("SELECT metadata FROM sensors WHERE name=?", (sensor,)).fetchone()
            if row is None or row[0] is None:
                return None
            return SensorMetadata.model_validate_json(row[0])

        return await self._rcall(q)

    async def put_metadata(self, meta: SensorMetadata) -> None:
        def tx(con: sqlite3.Connection) -> None:
            con.execute("BEGIN IMMEDIATE")
            try:
                self._sid(con, meta.name, True)
                row = con.execute(
                    "SELECT metadata FROM sensors WHERE name=?", (meta.name,)
                ).fetchone()
                merged = meta
                if row and row[0]:
                    merged = SensorMetadata.model_validate_json(row[0]).merged(meta)
                con.execute(
                    "UPDATE sensors SET metadata=? WHERE name=?",
                    (merged.model_dump_json(exclude_defaults=False), meta.name),
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                self._sids.pop(meta.name, None)
                raise

        await self._wcall(tx)

    async def list_metadata(self, prefix: str = "/") -> list[SensorMetadata]:
        wanted = set(await self.sensors(prefix))

        def q(con: sqlite3.Connection) -> list[SensorMetadata]:
            rows = con.execute(
                "SELECT name, metadata FROM sensors WHERE metadata IS NOT NULL ORDER BY name"
            )
            return [SensorMetadata.model_validate_json(m) for n, m in rows if n in wanted]

        return await self._rcall(q)

    # ------------------------------------------------------------------ virtual sensors
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        text = json.dumps(definition)
        await self._wcall(
            lambda c: c.execute("INSERT OR REPLACE INTO virtual_defs VALUES (?,?)", (name, text))
        )

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        row = await self._rcall(
            lambda c: c.execute(
                "SELECT definition FROM virtual_defs WHERE name=?", (name,)
            ).fetchone()
        )
        return None if row is None else dict(json.loads(row[0]))

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        rows = await self._rcall(
            lambda c: c.execute("SELECT name, definition FROM virtual_defs").fetchall()
        )
        return {n: json.loads(d) for n, d in rows}

    async def delete_virtual(self, name: str) -> bool:
        def tx(con: sqlite3.Connection) -> bool:
            con.execute("BEGIN IMMEDIATE")
            n = con.execute("DELETE FROM virtual_defs WHERE name=?", (name,)).rowcount
            con.execute("DELETE FROM virtual_ranges WHERE name=?", (name,))
            con.execute("DELETE FROM virtual_points WHERE name=?", (name,))
            con.execute("COMMIT")
            return n > 0

        return await self._wcall(tx)

    async def write_virtual_results(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        timestamps_ns: Int64Array,
        values: Float64Array,
        computed_at_ns: int,
    ) -> None:
        def tx(con: sqlite3.Connection) -> None:
            con.execute("BEGIN IMMEDIATE")
            try:
                _drop_virtual(con, name, start_ns, end_ns)
                con.executemany(
                    "INSERT OR REPLACE INTO virtual_points VALUES (?,?,?)",
                    zip(
                        [name] * len(timestamps_ns),
                        timestamps_ns.tolist(),
                        _nan_to_none(values),
                        strict=True,
                    ),
                )
                con.execute(
                    "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)",
                    (name, start_ns, end_ns, computed_at_ns),
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

        await self._wcall(tx)

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        def q(con: sqlite3.Connection) -> VirtualResults:
            rng = con.execute(
                "SELECT start_ns, end_ns, computed_at FROM virtual_ranges "
                "WHERE name=? AND end_ns>? AND start_ns<? ORDER BY start_ns",
                (name, start_ns, end_ns),
            ).fetchall()
            pts = con.execute(
                "SELECT ts, value FROM virtual_points WHERE name=? AND ts>=? AND ts<? ORDER BY ts",
                (name, start_ns, end_ns),
            ).fetchall()
            ts = np.fromiter((p[0] for p in pts), dtype=np.int64, count=len(pts))
            vs = np.fromiter(
                (np.nan if p[1] is None else p[1] for p in pts), dtype=np.float64, count=len(pts)
            )
            return VirtualResults(
                covered=[(int(a), int(b)) for a, b, _ in rng],
                series=Series(name, ts, vs),
                computed_at_ns=[int(c) for _, _, c in rng],
            )

        return await self._rcall(q)

    async def invalidate_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        def tx(con: sqlite3.Connection) -> None:
            con.execute("BEGIN IMMEDIATE")
            _drop_virtual(con, name, start_ns, end_ns)
            con.execute("COMMIT")

        await self._wcall(tx)

    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        def q(con: sqlite3.Connection) -> dict[str, int]:
            rows = con.execute(
                "SELECT s.name, MIN(w.min_ts) FROM writes w JOIN sensors s ON s.id=w.sid "
                "WHERE w.written_at>? GROUP BY s.name",
                (since_ns,),
            ).fetchall()
            wanted = set(sensors)
            return {n: int(m) for n, m in rows if n in wanted}

        return await self._rcall(q)

    # ------------------------------------------------------------------ jobs
    async def put_job(self, job: JobRecord) -> None:
        def tx(con: sqlite3.Connection) -> None:
            row = con.execute(
                "SELECT start_ns, nodes FROM jobs WHERE domain_id=? AND job_id=?",
                (job.domain_id, job.job_id),
            ).fetchone()
            start = job.start_ns
            nodes = list(job.nodes)
            if row is not None:
                # A job-end record may carry no node list; keep the start's.
                start = int(row[0]) if job.start_ns == 0 else job.start_ns
                nodes = nodes or json.loads(row[1])
            con.execute(
                "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?)",
                (job.domain_id, job.job_id, job.user_id, start, job.end_ns, json.dumps(nodes)),
            )

        await self._wcall(tx)

    async def jobs(
        self, start_ns: int | None = None, end_ns: int | None = None, node: str | None = None
    ) -> list[JobRecord]:
        def q(con: sqlite3.Connection) -> list[JobRecord]:
            rows = con.execute(
                "SELECT domain_id, job_id, user_id, start_ns, end_ns, nodes FROM jobs "
                "WHERE (? IS NULL OR start_ns < ?) AND (? IS NULL OR end_ns IS NULL OR end_ns > ?) "
                "ORDER BY start_ns",
                (end_ns, end_ns, start_ns, start_ns),
            ).fetchall()
            out = []
            for d, j, u, s, e, n in rows:
                nodes = tuple(json.loads(n))
                if node is not None and node not in nodes:
                    continue
                out.append(
                    JobRecord(
                        domain_id=d, job_id=j, user_id=u or "", start_ns=s, end_ns=e, nodes=nodes
                    )
                )
            return out

        return await self._rcall(q)

    # ------------------------------------------------------------------ retention
    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        def tx(con: sqlite3.Connection) -> int:
            sid = self._sid(con, sensor, False)
            if sid is None:
                return 0
            return int(
                con.execute(
                    "DELETE FROM readings WHERE sid=? AND ts>=? AND ts<?", (sid, start_ns, end_ns)
                ).rowcount
            )

        return await self._wcall(tx)

    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        targets = await self.sensors(prefix)

        def tx(con: sqlite3.Connection) -> int:
            con.execute("BEGIN IMMEDIATE")
            total = 0
            for name in targets:
                sid = self._sid(con, name, False)
                if sid is not None:
                    total += con.execute(
                        "DELETE FROM readings WHERE sid=? AND ts<?", (sid, ts_ns)
                    ).rowcount
            con.execute("DELETE FROM writes WHERE written_at<?", (ts_ns,))
            con.execute("COMMIT")
            return total

        return await self._wcall(tx)

    async def apply_retention(self, now_ns: int) -> int:
        total = 0
        for meta in await self.list_metadata("/"):
            if meta.ttl_ms:
                cutoff = now_ns - meta.ttl_ms * 1_000_000
                total += await self.delete_range(meta.name, -(2**63), cutoff)
        return total

    async def stats(self) -> dict[str, Any]:
        def q(con: sqlite3.Connection) -> dict[str, Any]:
            return {
                "backend": "sqlite",
                "path": str(self.path),
                "sensors": con.execute("SELECT COUNT(*) FROM sensors").fetchone()[0],
                "readings": con.execute("SELECT COUNT(*) FROM readings").fetchone()[0],
                "virtual_sensors": con.execute("SELECT COUNT(*) FROM virtual_defs").fetchone()[0],
                "jobs": con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0],
                "file_bytes": self.path.stat().st_size if self.path.exists() else 0,
                "schema_version": SCHEMA_VERSION,
            }

        return await self._rcall(q)


def _nan_to_none(values: Float64Array) -> list[float | None]:
    # SQLite stores NaN as NULL anyway; be explicit so reads map NULL back to NaN.
    vals: list[float | None] = values.tolist()
    if bool(np.isnan(values).any()):
        vals = [None if v != v else v for v in vals]  # type: ignore[comparison-overlap]
    return vals


def _drop_virtual(con: sqlite3.Connection, name: str, start_ns: int, end_ns: int) -> None:
    """Remove coverage and points in [start, end); trim ranges that straddle the edges."""
    con.execute(
        "DELETE FROM virtual_points WHERE name=? AND ts>=? AND ts<?", (name, start_ns, end_ns)
    )
    rows = con.execute(
        "SELECT start_ns, end_ns, computed_at FROM virtual_ranges WHERE name=? AND end_ns>? AND start_ns<?",
        (name, start_ns, end_ns),
    ).fetchall()
    for a, b, c in rows:
        con.execute("DELETE FROM virtual_ranges WHERE name=? AND start_ns=?", (name, a))
        if a < start_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, a, start_ns, c)
            )
        if b > end_ns:
            con.execute(
                "INSERT OR REPLACE INTO virtual_ranges VALUES (?,?,?,?)", (name, end_ns, b, c)
            )
