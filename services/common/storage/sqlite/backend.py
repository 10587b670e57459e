"""The embedded default backend: one SQLite file in WAL mode, no server to run.

Readings are staged one row per write and compacted into per-sensor columnar
chunks (:mod:`.writer`, :mod:`.reader`), virtual results into chunks
of their own (:mod:`.virtual`); metadata, virtual definitions and jobs are
plain tables (:mod:`.catalog`). One writer connection on a dedicated thread
(SQLite allows one writer at a time); reads run on a small pool of reader
threads, each with its own connection, inside a read transaction so that a
read never sees half of a compaction. Several instances (in one process or
several) may open the same file: SQLite's locks serialise their writers.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry

from services.common.errors import (
    PermanentStorageError,
    RetryableStorageError,
    StorageError,
)
from services.common.readings import Batch, Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage import chunks
from services.common.storage.base import (
    Child,
    StorageBackend,
    VirtualResults,
    check_names,
    children_of,
)
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import SqliteSettings
from services.common.storage.sqlite import catalog as cat
from services.common.storage.sqlite import virtual as vir
from services.common.storage.sqlite.reader import (
    StagedCache,
    chunk_pieces,
    chunk_starts,
    modified_since,
    newest_ts,
    staged_pieces,
)
from services.common.storage.sqlite.schema import SCHEMA_VERSION, ensure_schema
from services.common.storage.sqlite.writer import ChunkStore, log_delete, prune_writes

T = TypeVar("T")
log = logging.getLogger(__name__)

_MIN_I64 = -(2**63)
_MAX_I64 = 2**63 - 1


def _wrap(exc: sqlite3.Error) -> tuple[StorageError, str]:
    """(error to raise, metric reason) for a driver error."""
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        if "locked" in msg or "busy" in msg:
            return RetryableStorageError(f"sqlite: {msg} (another writer holds the lock)"), "locked"
        if "full" in msg:
            return RetryableStorageError(f"sqlite: {msg} (free disk space)"), "disk_full"
        if "disk I/O" in msg or "unable to open" in msg:
            return RetryableStorageError(f"sqlite: {msg}"), "io"
    return PermanentStorageError(f"sqlite: {msg}"), "permanent"


class SqliteStorage(StorageBackend):
    """SQLite backend (see module docstring)."""

    kind: ClassVar[str] = "sqlite"
    atomic_writes: ClassVar[bool] = True

    def __init__(
        self, settings: SqliteSettings | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings or SqliteSettings()
        self.path = Path(self.settings.path)
        self.metrics = StorageMetrics.of(registry)
        self.store = ChunkStore()
        self._staged = StagedCache()
        self._w: sqlite3.Connection | None = None
        self._readers: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._wx: ThreadPoolExecutor | None = None
        self._rx: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ plumbing
    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        con.execute(f"PRAGMA busy_timeout={int(self.settings.busy_timeout_ms)}")
        con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA synchronous={self.settings.synchronous}")
        return con

    def _reader(self) -> sqlite3.Connection:
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self._connect()
            with self._lock:
                self._readers.append(con)
        return con

    async def _run(self, pool: ThreadPoolExecutor | None, op: str, fn: Callable[[], T]) -> T:
        if pool is None:
            raise RetryableStorageError(f"sqlite storage {self.path} is not open")
        started = time.perf_counter()

        def guarded() -> T:
            try:
                return fn()
            except sqlite3.Error as exc:
                err, reason = _wrap(exc)
                self.metrics.errors.labels(self.kind, reason).inc()
                raise err from exc
            except (OverflowError, ValueError) as exc:  # a value SQLite cannot hold
                self.metrics.errors.labels(self.kind, "bad_value").inc()
                raise PermanentStorageError(f"sqlite: {op}: {exc}") from exc

        try:
            return await asyncio.get_running_loop().run_in_executor(pool, guarded)
        finally:
            self.metrics.op_seconds.labels(self.kind, op).observe(time.perf_counter() - started)

    async def _read(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one read transaction (a consistent snapshot)."""

        def tx() -> T:
            con = self._reader()
            con.execute("BEGIN")
            try:
                return fn(con)
            finally:
                con.execute("COMMIT")

        return await self._run(self._rx, op, tx)

    async def _write(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction on the writer thread."""
        con = self._w

        def tx() -> T:
            assert con is not None
            return self._in_write_tx(con, fn)

        return await self._run(self._wx if con is not None else None, op, tx)

    def _in_write_tx(self, con: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        con.execute("BEGIN IMMEDIATE")
        try:
            result = fn(con)
            con.execute("COMMIT")
            self.store.committed()
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            self.store.forget_uncommitted()
            raise
        return result

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        if self._w is not None:
            return
        self._wx = ThreadPoolExecutor(1, thread_name_prefix="sqlite-w")
        self._rx = ThreadPoolExecutor(self.settings.reader_threads, thread_name_prefix="sqlite-r")

        def setup() -> sqlite3.Connection:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = self._connect()
            try:
                found = ensure_schema(con, str(self.path))
            except BaseException:
                con.close()
                raise
            if found and found < SCHEMA_VERSION:
                log.info(
                    "sqlite: migrated %s from schema %d to %d", self.path, found, SCHEMA_VERSION
                )
            return con

        try:
            self._w = await self._run(self._wx, "open", setup)
        except OSError as exc:
            await self.close()
            raise PermanentStorageError(f"sqlite: cannot create {self.path}: {exc}") from exc
        except BaseException:
            await self.close()
            raise
        self.metrics.service.up.set(1)

    async def close(self) -> None:
        for pool in (self._wx, self._rx):
            if pool is not None:
                await asyncio.get_running_loop().run_in_executor(None, pool.shutdown, True)
        self._wx = self._rx = None
        if self._w is not None:
            self._w.close()
            self._w = None
        with self._lock:
            for con in self._readers:
                con.close()
            self._readers.clear()
        self._local = threading.local()

    async def ping(self) -> bool:
        try:
            await self._read("ping", lambda c: c.execute("SELECT 1").fetchone())
            return True
        except StorageError:
            return False

    # ------------------------------------------------------------------ readings
    async def write(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        if self.store.known(batch.sensors) is None:  # known names were validated before
            try:
                check_names(batch.sensors, self.kind)
            except PermanentStorageError:
                self.metrics.errors.labels(self.kind, "bad_name").inc()
                raise
        store = self.store

        def tx(con: sqlite3.Connection) -> tuple[int, int]:
            store.stage(con, batch, store.sensor_ids(con, batch.sensors), time.time_ns())
            return store.staged_totals(con)

        rows, staged = await self._write("write", tx)
        self.metrics.written.labels(self.kind).inc(len(batch))
        self.metrics.staged.labels(self.kind).set(staged)
        if staged >= self.settings.compact_readings or rows >= self.settings.compact_writes:
            await self._compact_quietly()

    async def compact(self) -> int:
        """Move every staged write into chunks now; returns the readings moved."""

        def tx(con: sqlite3.Connection) -> int:
            moved = self.store.compact(con)
            prune_writes(con, time.time_ns() - int(self.settings.modified_log_s * 1e9))
            return moved

        moved = await self._write("compact", tx)
        self.metrics.compactions.labels(self.kind).inc()
        self.metrics.staged.labels(self.kind).set(0)
        return moved

    async def _compact_quietly(self) -> None:
        # The write is committed already; a failed compaction only delays the next one.
        try:
            await self.compact()
        except StorageError as exc:
            self.metrics.errors.labels(self.kind, "compaction").inc()
            log.warning("sqlite: compaction of %s failed, will retry: %s", self.path, exc)

    def _snapshot(
        self, con: sqlite3.Connection, sensors: Sequence[str], start: int, end: int
    ) -> dict[str, Series]:
        """Series of ``sensors`` in ``[start, end)``, inside one read transaction."""
        out = {s: Series.empty(s) for s in sensors}
        start, end = max(start, _MIN_I64), min(end, _MAX_I64)
        if start >= end:
            return out
        found = {s: f for s in out if (f := self.store.sensor_id(con, s)) is not None}
        if not found:
            return out
        sids = np.unique(np.array([f[0] for f in found.values()], dtype=np.int64))
        staged = staged_pieces(self._staged.rows(con, start, end), sids, start, end)
        for name, (sid, span) in found.items():
            pieces = chunk_pieces(con, sid, span, start, end) + staged.get(sid, [])
            ts, vs = chunks.merge(pieces)
            if not ts.flags.writeable:
                ts, vs = ts.copy(), vs.copy()
            out[name] = Series(name, ts, vs)
        return out

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        return (await self.read_many([sensor], start_ns, end_ns))[sensor]

    async def read_many(
        self, sensors: Sequence[str], start_ns: int, end_ns: int
    ) -> dict[str, Series]:
        out = await self._read(
            "read", lambda c: self._snapshot(c, list(dict.fromkeys(sensors)), start_ns, end_ns)
        )
        self.metrics.read_points.labels(self.kind).inc(sum(len(s) for s in out.values()))
        return out

    async def cut_points(self, sensor: str, start_ns: int, end_ns: int) -> list[int]:
        """Where the sensor's chunks begin: a slice that starts at one decodes no chunk
        its neighbour decodes too (each cut inside a chunk costs decoding it twice)."""

        def q(con: sqlite3.Connection) -> list[int]:
            found = self.store.sensor_id(con, sensor)
            return [] if found is None else chunk_starts(con, found[0], start_ns, end_ns)

        return await self._read("cut_points", q)

    async def latest(self, sensor: str) -> tuple[int, float] | None:
        def q(con: sqlite3.Connection) -> tuple[int, float] | None:
            found = self.store.sensor_id(con, sensor)
            if found is None:
                return None
            staged = self._staged.rows(con, _MIN_I64, _MAX_I64)
            t = newest_ts(con, found[0], found[1], staged)
            if t is None:
                return None
            s = self._snapshot(con, [sensor], t, t + 1)[sensor]
            if not len(s):  # t is int64's max, which no half-open range reaches
                s = self._snapshot(con, [sensor], _MIN_I64, _MAX_I64)[sensor]
            return (int(s.timestamps_ns[-1]), float(s.values[-1])) if len(s) else None

        return await self._read("latest", q)

    # ------------------------------------------------------------------ hierarchy
    async def has_sensor(self, sensor: str) -> bool:
        return await self._read(
            "has_sensor",
            lambda c: (
                c.execute("SELECT 1 FROM sensors WHERE name=?", (sensor,)).fetchone() is not None
            ),
        )

    async def sensors(self, prefix: str = "/") -> list[str]:
        return await self._read("sensors", lambda c: cat.sensor_names(c, prefix))

    async def children(self, prefix: str = "/") -> list[Child]:
        return children_of(await self.sensors(prefix), prefix)

    # ------------------------------------------------------------------ metadata
    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        return await self._read("metadata", lambda c: cat.get_metadata(c, sensor))

    async def put_metadata(self, meta: SensorMetadata) -> None:
        await self._write("metadata", lambda c: cat.put_metadata(c, meta))

    async def list_metadata(self, prefix: str = "/") -> list[SensorMetadata]:
        return await self._read("metadata", lambda c: cat.list_metadata(c, prefix))

    # ------------------------------------------------------------------ virtual sensors
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        await self._write("virtual", lambda c: cat.put_virtual(c, name, definition))

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        return await self._read("virtual", lambda c: cat.get_virtual(c, name))

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        return await self._read("virtual", cat.list_virtual)

    async def delete_virtual(self, name: str) -> bool:
        return await self._write("virtual", lambda c: cat.delete_virtual(c, name))

    async def write_virtual_results(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        timestamps_ns: Int64Array,
        values: Float64Array,
        computed_at_ns: int,
    ) -> None:
        await self._write(
            "virtual",
            lambda c: vir.write_results(
                c, name, start_ns, end_ns, timestamps_ns, values, computed_at_ns
            ),
        )

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        return await self._read("virtual", lambda c: vir.read_results(c, name, start_ns, end_ns))

    async def invalidate_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        await self._write("virtual", lambda c: vir.drop(c, name, start_ns, end_ns))

    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        def q(con: sqlite3.Connection) -> dict[str, int]:
            wanted: dict[int, str] = {}
            for s in set(sensors):
                found = self.store.sensor_id(con, s)
                if found is not None:
                    wanted[found[0]] = s
            if not wanted:
                return {}
            out = modified_since(con, wanted, since_ns)
            pruned = con.execute("SELECT value FROM meta_kv WHERE key='writes_pruned'").fetchone()
            if pruned is not None and since_ns < int(pruned[0]):
                # Writes after since_ns may have left the log: answer conservatively
                # with each sensor's earliest stored reading.
                for sid, name in wanted.items():
                    first = con.execute(
                        "SELECT MIN(t0) FROM chunks WHERE sid=?", (sid,)
                    ).fetchone()[0]
                    if first is not None:
                        out[name] = min(out.get(name, int(first)), int(first))
            return out

        return await self._read("modified_since", q)

    # ------------------------------------------------------------------ jobs
    async def put_job(self, job: JobRecord) -> None:
        await self._write("jobs", lambda c: cat.put_job(c, job))

    async def jobs(
        self, start_ns: int | None = None, end_ns: int | None = None, node: str | None = None
    ) -> list[JobRecord]:
        return await self._read("jobs", lambda c: cat.jobs(c, start_ns, end_ns, node))

    async def get_job(self, job_id: str, domain_id: str = "default") -> JobRecord | None:
        return await self._read("get_job", lambda c: cat.get_job(c, job_id, domain_id))

    # ------------------------------------------------------------------ retention
    def _delete(self, con: sqlite3.Connection, targets: Sequence[tuple[str, int, int]]) -> int:
        self.store.compact(con)  # staged rows hold many sensors: move them into chunks first
        removed = 0
        for name, start, end in targets:
            found = self.store.sensor_id(con, name)
            start, end = max(start, _MIN_I64), min(end, _MAX_I64)
            if found is not None and start < end:
                removed += self.store.delete(con, found[0], found[1], start, end)
        return removed

    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        def tx(con: sqlite3.Connection) -> int:
            removed = self._delete(con, [(sensor, start_ns, end_ns)])
            found = self.store.sensor_id(con, sensor)
            if removed and found is not None:
                log_delete(con, found[0], max(start_ns, _MIN_I64), time.time_ns())
            return removed

        return await self._write("delete", tx)

    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        def tx(con: sqlite3.Connection) -> int:
            targets = [(n, _MIN_I64, ts_ns) for n in cat.sensor_names(con, prefix)]
            return self._delete(con, targets)

        return await self._write("delete", tx)

    async def apply_retention(self, now_ns: int) -> int:
        def tx(con: sqlite3.Connection) -> int:
            targets = [
                (m.name, _MIN_I64, now_ns - m.ttl_ms * 1_000_000)
                for m in cat.list_metadata(con, "/")
                if m.ttl_ms
            ]
            return self._delete(con, targets)

        return await self._write("delete", tx)

    async def stats(self) -> dict[str, Any]:
        def q(con: sqlite3.Connection) -> dict[str, Any]:
            def one(sql: str) -> Any:
                return con.execute(sql).fetchone()

            chunk_n, chunk_bytes, n_chunks = one(
                "SELECT COALESCE(SUM(n),0), COALESCE(SUM(length(ts)+length(vs)),0), COUNT(*) "
                "FROM chunks"
            )
            staged_rows, staged_n = one("SELECT COUNT(*), COALESCE(SUM(n),0) FROM staged")
            files = [self.path, Path(f"{self.path}-wal")]
            return {
                "backend": self.kind,
                "path": str(self.path),
                "schema_version": SCHEMA_VERSION,
                "sensors": one("SELECT COUNT(*) FROM sensors")[0],
                "readings": int(chunk_n) + int(staged_n),
                "staged_readings": int(staged_n),
                "staged_writes": int(staged_rows),
                "chunks": int(n_chunks),
                "sealed_chunks": one("SELECT COUNT(*) FROM chunks WHERE level < 0")[0],
                "bytes_per_reading": round(chunk_bytes / chunk_n, 2) if chunk_n else None,
                "virtual_sensors": one("SELECT COUNT(*) FROM virtual_defs")[0],
                "virtual_points": vir.stored_points(con),
                "jobs": one("SELECT COUNT(*) FROM jobs")[0],
                "file_bytes": sum(f.stat().st_size for f in files if f.exists()),
            }

        return await self._read("stats", q)
