"""The ClickHouse backend: one server, or a replicated, sharded cluster.

Readings are one row each in a ReplacingMergeTree ordered by ``(sensor, ts)``:
an insert block is sorted stably, and merges (and ``FINAL``) keep the row of the
newest part, so the last write of a (sensor, ts) wins within a batch and
across batches. Reads use ``FINAL``. Writes go out as Native blocks over HTTP
(:mod:`.native`); in cluster mode through the Distributed table with
``insert_distributed_sync=1`` (acknowledged only when every shard's part is
written) and ``insert_quorum`` (only when that many replicas hold it). Writes
are at-least-once (:attr:`atomic_writes` False): a batch spans partitions and
shards, and a failure may leave part of it stored; the retry of the whole
batch is idempotent (replicated tables drop identical blocks; FINAL collapses
the rest). Deletes are mutations, awaited until done. Rollups: :mod:`.rollups`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from prometheus_client import CollectorRegistry

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.readings import Batch, Int64Array, Series
from services.common.storage.base import (
    Child,
    StorageBackend,
    check_names,
    children_of,
)
from services.common.storage.clickhouse import native, rollups
from services.common.storage.clickhouse.catalog import (
    Catalog,
    Clock,
    chunked,
    json_rows,
    prefix_filter,
)
from services.common.storage.clickhouse.http import ClickHouseHttp
from services.common.storage.clickhouse.native import literal, literals
from services.common.storage.clickhouse.schema import Schema
from services.common.storage.delegated import CatalogMethods
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import ClickHouseSettings

MAX_READABLE_NS = 2**63 - 2
_NAMED_LIMIT = 2_000_000


class ClickHouseStorage(CatalogMethods[Catalog], StorageBackend):
    """ClickHouse backend (see module docstring)."""

    kind: ClassVar[str] = "clickhouse"
    atomic_writes: ClassVar[bool] = False

    def __init__(
        self, settings: ClickHouseSettings | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = s = settings or ClickHouseSettings()
        self.metrics = StorageMetrics.of(registry)
        self.http = ClickHouseHttp(s, self.metrics)
        self.clock = Clock()
        self.names = native.StringCache()
        self.schema = Schema(s, ())
        self.catalog = Catalog(self.http, self.schema, self.clock, {})
        self._sem = asyncio.Semaphore(s.concurrency)
        self._last_log_ns = 0
        self._named: set[str] = set()
        """Sensor names this process knows are in ``<p>_names``."""

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self.http.open()
        try:
            s = self.settings
            self.schema = Schema(s, self.http.version)
            insert: dict[str, Any] = {}
            if s.cluster:
                insert["insert_distributed_sync"] = 1
                if s.insert_quorum:
                    insert["insert_quorum"] = s.insert_quorum
                    insert["insert_quorum_timeout"] = int(s.insert_quorum_timeout_s * 1000)
            self.insert_settings = insert
            self.catalog = Catalog(self.http, self.schema, self.clock, insert)
            if s.create_tables:
                for sql in self.schema.ddl():
                    await self.http.request(
                        sql,
                        what="bootstrap",
                        settings={"distributed_ddl_task_timeout": int(s.mutation_timeout_s)}
                        if s.cluster
                        else None,
                    )
            await self._check_tables()
        except BaseException:
            await self.http.close()
            raise
        self.metrics.service.up.set(1)

    async def _check_tables(self) -> None:
        found = json_rows(
            await self.http.query(
                f"SELECT name FROM system.tables WHERE database = {literal(self.settings.database)} "
                "FORMAT JSONEachRow"
            )
        )
        have = {r["name"] for r in found}
        missing = [t for t in self.schema.tables() if t not in have]
        if missing:
            raise PermanentStorageError(
                f"clickhouse {self.http.where()}: database {self.settings.database!r} lacks "
                f"tables {', '.join(missing)}; set storage.clickhouse.create_tables or create "
                "them with the DDL in docs/storage.md"
            )
        cols = json_rows(
            await self.http.query(
                "SELECT name, type FROM system.columns WHERE database = "
                f"{literal(self.settings.database)} AND table = {literal(self.settings.table)} "
                "FORMAT JSONEachRow"
            )
        )
        types = {c["name"]: c["type"] for c in cols}
        want = {
            "sensor": ("String", "LowCardinality(String)"),
            "ts": ("Int64",),
            "value": ("Float64",),
        }
        wrong = [f"{k} {' or '.join(v)}" for k, v in want.items() if types.get(k) not in v]
        if wrong:
            raise PermanentStorageError(
                f"clickhouse {self.http.where()}: table {self.settings.database}."
                f"{self.settings.table} needs columns {', '.join(wrong)}; it has "
                f"{', '.join(f'{k} {v}' for k, v in types.items()) or 'none'}"
            )

    async def close(self) -> None:
        await self.http.close()

    async def ping(self) -> bool:
        return await self.http.ping()

    # ------------------------------------------------------------------ readings
    def _validate(self, batch: Batch) -> None:
        try:
            check_names(batch.sensors, self.kind)
        except PermanentStorageError:
            self.metrics.errors.labels(self.kind, "bad_name").inc()
            raise
        if len(batch) and int(batch.timestamps_ns.max()) > MAX_READABLE_NS:
            self.metrics.errors.labels(self.kind, "bad_time").inc()
            raise PermanentStorageError(
                "clickhouse: batch rejected, nothing stored: a reading at int64's largest ns "
                "lies beyond every range's exclusive end"
            )

    def _log_time(self) -> int:
        now = max(time.time_ns(), self._last_log_ns)
        self._last_log_ns = now
        return now

    async def write(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        self._validate(batch)
        started = time.perf_counter()
        table = self.schema.name()
        sensors, mins = native.earliest_per_name(self.names, batch)
        # The log goes with the readings (without waiting for a quorum: it is a hint that
        # only ever makes modified_since more conservative); if it fails the write fails,
        # and the retry logs it again, newer than any result computed in between.
        log = self._log_and_name(sensors, mins)
        parts = native.slice_batch(batch, self.settings.insert_rows)

        async def readings() -> None:
            for part in parts:
                await self.http.insert(
                    f"INSERT INTO {table} FORMAT Native",
                    native.readings_block(part, self.names),
                    **self.insert_settings,
                )

        await asyncio.gather(log, readings())
        self._named.update(sensors)  # only once the write is stored: a retry names them again
        self.metrics.written.labels(self.kind).inc(len(batch))
        self.metrics.op_seconds.labels(self.kind, "write").observe(time.perf_counter() - started)

    async def _log_and_name(self, sensors: list[str], mins: Int64Array) -> None:
        """The write-log rows of a write, and the names this process has not stored yet."""
        new = [n for n in sensors if n not in self._named]
        if len(self._named) + len(new) > _NAMED_LIMIT:
            self._named.clear()  # bounded memory: names are stored again, harmlessly
        await asyncio.gather(
            self.catalog.log_writes(sensors, mins, self._log_time()), self.catalog.add_names(new)
        )

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        if start_ns >= end_ns:
            return Series.empty(sensor)
        started = time.perf_counter()
        async with self._sem:
            body = await self.http.select(
                f"SELECT ts, value FROM {self.schema.name()} FINAL WHERE sensor = {literal(sensor)} "
                f"AND ts >= {start_ns} AND ts < {end_ns} FORMAT Native"
            )
        # FINAL's answer comes sorted within each partition merge: checking here and sorting
        # only when it is not (partitions out of order) costs less than ORDER BY there.
        ts, vs = native.sorted_points(body)
        self.metrics.read_points.labels(self.kind).inc(ts.shape[0])
        self.metrics.op_seconds.labels(self.kind, "read").observe(time.perf_counter() - started)
        return Series(sensor, ts, vs)

    async def read_many(
        self, sensors: Sequence[str], start_ns: int, end_ns: int
    ) -> dict[str, Series]:
        unique = list(dict.fromkeys(sensors))
        out = {s: Series.empty(s) for s in unique}
        if start_ns >= end_ns or not unique:
            return out

        async def chunk(part: list[str]) -> None:
            async with self._sem:
                body = await self.http.select(
                    f"SELECT toUInt32(indexOf([{', '.join(literal(s) for s in part)}], sensor)) AS i, "
                    f"ts, value FROM {self.schema.name()} FINAL WHERE sensor IN {literals(part)} "
                    f"AND ts >= {start_ns} AND ts < {end_ns} ORDER BY i, ts FORMAT RowBinary"
                )
            idx, ts, vs = native.indexed_points(body)
            bounds = np.searchsorted(idx, np.arange(1, len(part) + 2))
            for k, name in enumerate(part):
                a, b = int(bounds[k]), int(bounds[k + 1])
                if b > a:
                    out[name] = Series(name, ts[a:b], vs[a:b])
            self.metrics.read_points.labels(self.kind).inc(ts.shape[0])

        await asyncio.gather(*(chunk(list(part)) for part in chunked(unique)))
        return out

    async def latest(self, sensor: str) -> tuple[int, float] | None:
        body = await self.http.select(
            f"SELECT ts, value FROM {self.schema.name()} FINAL WHERE sensor = {literal(sensor)} "
            "ORDER BY ts DESC LIMIT 1 FORMAT RowBinary"
        )
        ts, vs = native.points(body)
        return (int(ts[0]), float(vs[0])) if ts.shape[0] else None

    async def read_aggregated(
        self, sensor: str, start_ns: int, end_ns: int, interval_ns: int, op: str
    ) -> Series | None:
        if not self.settings.rollups:
            return None
        return await rollups.read(self, sensor, start_ns, end_ns, interval_ns, op)

    # ------------------------------------------------------------------ hierarchy
    async def has_sensor(self, sensor: str) -> bool:
        return bool(await self.catalog.names(f"sensor = {literal(sensor)}"))

    async def sensors(self, prefix: str = "/") -> list[str]:
        from services.common import names

        return [
            n
            for n in await self.catalog.names(prefix_filter("sensor", prefix))
            if names.is_under(n, prefix)
        ]

    async def children(self, prefix: str = "/") -> list[Child]:
        return children_of(await self.sensors(prefix), prefix)

    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        out = await self.catalog.written_since(sensors, since_ns)
        pruned = await self.catalog.get_state("writes_pruned")
        if pruned is not None and since_ns < pruned:
            # Writes after since_ns may have left the log: answer conservatively.
            firsts = []
            for part in chunked(sensors):
                firsts += json_rows(
                    await self.http.query(
                        f"SELECT sensor, min(ts) AS m FROM {self.schema.name()} WHERE sensor IN "
                        f"{literals(part)} GROUP BY sensor FORMAT JSONEachRow"
                    )
                )
            for r in firsts:
                m = int(r["m"])
                out[r["sensor"]] = min(out.get(r["sensor"], m), m)
        return out

    # ------------------------------------------------------------------ retention
    async def _delete(self, suffix: str, where: str) -> None:
        """``ALTER TABLE ... DELETE`` on the stored table(s), awaited until done everywhere
        it can be seen from the configured nodes."""
        t = self.schema
        sql = f"ALTER TABLE {t.local(suffix)}{t.on_cluster()} DELETE WHERE {where}"
        settings: dict[str, Any] = {}
        if t.clustered:
            settings["distributed_ddl_task_timeout"] = int(self.settings.mutation_timeout_s)
        if t.f.ttl:  # modern servers wait by themselves
            settings["mutations_sync"] = 2
        await self.http.request(sql, settings=settings or None, what="delete")
        if not t.f.ttl:
            await self._await_mutations(suffix)

    async def _await_mutations(self, suffix: str) -> None:
        table = self.settings.table + suffix + ("_local" if self.schema.clustered else "")
        sql = (
            "SELECT count() FROM system.mutations WHERE database = "
            f"{literal(self.settings.database)} AND table = {literal(table)} AND is_done = 0"
        )
        deadline = time.monotonic() + self.settings.mutation_timeout_s
        for i in range(len(self.http.clients)):
            while True:
                try:
                    left = int((await self.http.request(sql, node=i)).decode().strip() or 0)
                except RetryableStorageError:
                    break  # a node that is down applies the mutation from the log when back
                if left == 0:
                    break
                if time.monotonic() > deadline:
                    raise RetryableStorageError(
                        f"clickhouse {self.http.where(i)}: {left} delete(s) on {table} still "
                        f"running after {self.settings.mutation_timeout_s} s"
                    )
                await asyncio.sleep(0.05)

    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        if start_ns >= end_ns:
            return 0
        # logged as a write from start_ns on: virtual results over it go stale
        await self.catalog.log_writes([sensor], np.array([start_ns], np.int64), self._log_time())
        where = f"sensor = {literal(sensor)}"
        await self._delete("", f"{where} AND ts >= {start_ns} AND ts < {end_ns}")
        if self.settings.rollups:
            await rollups.rebuild(self, where, start_ns, end_ns)
        return -1

    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        where = prefix_filter("sensor", prefix)
        await self._delete("", f"{where} AND ts < {ts_ns}")
        if self.settings.rollups:
            await rollups.truncate(self, where, ts_ns)
        await self._prune_write_log()
        return -1

    async def apply_retention(self, now_ns: int) -> int:
        by_ttl: dict[int, list[str]] = {}
        for meta in await self.list_metadata("/"):
            if meta.ttl_ms:
                by_ttl.setdefault(meta.ttl_ms, []).append(meta.name)
        for ttl_ms, group in sorted(by_ttl.items()):
            for part in chunked(group):
                await self._delete(
                    "", f"sensor IN {literals(part)} AND ts < {now_ns - ttl_ms * 1_000_000}"
                )
        s = self.settings
        if not self.schema.f.ttl:  # TTL clauses do this on modern servers
            if s.raw_ttl_s:
                await self._delete("", f"ts < {now_ns - int(s.raw_ttl_s * 1e9)}")
            if s.rollups and s.rollup_ttl_s:
                await self._delete("_1m", f"t < {now_ns - int(s.rollup_ttl_s * 1e9)}")
        await self._prune_write_log()
        return -1

    async def _prune_write_log(self) -> None:
        cutoff = time.time_ns() - int(self.settings.modified_log_s * 1e9)
        newest = json_rows(
            await self.http.query(
                f"SELECT max(written_at) AS m, count() AS n FROM {self.schema.name('_writes')} "
                f"WHERE written_at < {cutoff} FORMAT JSONEachRow"
            )
        )
        if newest and int(newest[0]["n"]):
            old = await self.catalog.get_state("writes_pruned") or 0
            await self.catalog.set_state("writes_pruned", max(old, int(newest[0]["m"])))
            if not self.schema.f.ttl:
                await self._delete("_writes", f"written_at < {cutoff}")

    async def stats(self) -> dict[str, Any]:
        s = self.settings
        counts = json_rows(
            await self.http.query(
                f"SELECT count() AS rows, uniq(sensor) AS sensors FROM {self.schema.name()} "
                "FORMAT JSONEachRow"
            )
        )[0]
        parts = json_rows(
            await self.http.query(
                "SELECT table, sum(rows) AS rows, sum(bytes) AS bytes FROM system.parts "
                f"WHERE active AND database = {literal(s.database)} GROUP BY table "
                "FORMAT JSONEachRow"
            )
        )
        local = self.settings.table + ("_local" if self.schema.clustered else "")
        on_node = next((p for p in parts if p["table"] == local), None)
        out: dict[str, Any] = {
            "backend": self.kind,
            "urls": list(s.urls),
            "server_version": self.http.version_text,
            "database": s.database,
            "cluster": s.cluster or "(single server)",
            "readings": int(counts["rows"]),
            "sensors": int(counts["sensors"]),
            "virtual_sensors": len(await self.catalog.list_virtual()),
            "jobs": len(await self.catalog.jobs(None, None, None)),
            "features": {
                "codecs": self.schema.f.codecs,
                "low_cardinality": self.schema.f.low_cardinality,
                "ttl": self.schema.f.ttl,
            },
        }
        if on_node and int(on_node["rows"]):
            out["bytes_per_reading_on_node"] = int(on_node["bytes"]) / int(on_node["rows"])
        return out
