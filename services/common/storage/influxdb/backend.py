"""The InfluxDB backend: line protocol over HTTP in, InfluxQL out.

Works with InfluxDB 1.x, and with 2.x/3.x through their v1-compatible
``/write`` and ``/query`` endpoints (token auth; on 2.x the bucket
``<database>/<policy>`` is created with ``influxdb-client`` when missing).

Readings: measurement ``kelvin`` (configurable), tag ``sensor``, float field
``value``, ns precision; one series per sensor, so InfluxDB's own rule (same
series and time = overwrite) gives last-write-wins. Writes are at-least-once
(:attr:`atomic_writes` is False): a batch larger than ``write_lines`` goes out
in several requests, and a failure after the first leaves those stored; the
caller's retry of the whole batch is idempotent. Everything else is stored in
the same database (:mod:`.catalog`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, ClassVar, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry

from services.common import names
from services.common.errors import PermanentStorageError, StorageError
from services.common.logs import mask_url
from services.common.readings import Batch, Int64Array, Series
from services.common.storage.base import (
    Child,
    StorageBackend,
    check_names,
    children_of,
)
from services.common.storage.delegated import CatalogMethods
from services.common.storage.influxdb import catalog as ic
from services.common.storage.influxdb.catalog import InfluxCatalog
from services.common.storage.influxdb.http import InfluxHttp, rows
from services.common.storage.influxdb.protocol import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    check_identifier,
    decode_values,
    head,
    identifier,
    lines,
    name_of_tag,
    prefix_regex,
    read_csv_stream,
    string_literal,
    tag_value,
)
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import InfluxSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


class InfluxStorage(CatalogMethods[InfluxCatalog], StorageBackend):
    """InfluxDB backend (see module docstring)."""

    kind: ClassVar[str] = "influxdb"
    atomic_writes: ClassVar[bool] = False

    def __init__(
        self, settings: InfluxSettings | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = s = settings or InfluxSettings()
        self.m = check_identifier(s.measurement, "storage.influxdb.measurement")
        self.metrics = StorageMetrics.of(registry)
        self.http = InfluxHttp(s, self.metrics)
        self.catalog = InfluxCatalog(
            self.http, self.m, s.catalog_retention_policy or "", s.retention_policy or ""
        )
        self._readings = self.catalog.data_qualified(self.m)
        self._heads: dict[str, str] = {}
        self._hashes: dict[str, int] = {}
        self._writer_id = os.urandom(4).hex()
        self._last_log_ns = 0
        self._sem = asyncio.Semaphore(s.concurrency)

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self.http.open()
        try:
            await self.http.ping()
            if self.settings.create_database:
                await self._ensure_database()
        except BaseException:
            await self.http.close()
            raise
        self.metrics.service.up.set(1)

    async def close(self) -> None:
        await self.http.close()

    async def ping(self) -> bool:
        try:
            await self.http.ping()
            return True
        except StorageError:
            return False

    async def _ensure_database(self) -> None:
        s = self.settings
        try:
            await self.http.query(
                f"CREATE DATABASE {identifier(s.database)}", mutate=True, db=False
            )
        except PermanentStorageError:
            if not s.token:
                raise
            # 2.x has no CREATE DATABASE: create the bucket a v1 write maps to.
            # 3.x creates databases on first write.
            from services.common.storage.influxdb.v2 import ensure_buckets

            await asyncio.to_thread(ensure_buckets, s)
            return
        if s.retention_policy:
            res = await self.http.query(f"SHOW RETENTION POLICIES ON {identifier(s.database)}")
            have = {r["name"] for _, r in rows(res)}
            if s.retention_policy not in have:
                if not s.retention_duration:
                    raise PermanentStorageError(
                        f"influxdb: retention policy {s.retention_policy!r} does not exist on "
                        f"database {s.database!r}; create it or set "
                        "storage.influxdb.retention_duration"
                    )
                await self.http.query(
                    f"CREATE RETENTION POLICY {identifier(s.retention_policy)} ON "
                    f"{identifier(s.database)} DURATION {s.retention_duration} REPLICATION 1",
                    mutate=True,
                )

    # ------------------------------------------------------------------ readings
    def _validate(self, batch: Batch) -> None:
        try:
            check_names(batch.sensors, self.kind)
        except PermanentStorageError:
            self.metrics.errors.labels(self.kind, "bad_name").inc()
            raise
        ts = batch.timestamps_ns
        if len(batch) and (int(ts.min()) < MIN_TIME_NS or int(ts.max()) > MAX_TIME_NS):
            self.metrics.errors.labels(self.kind, "bad_time").inc()
            raise PermanentStorageError(
                f"influxdb: batch rejected, nothing stored: a timestamp lies outside InfluxDB's "
                f"range [{MIN_TIME_NS}, {MAX_TIME_NS}] ns"
            )

    def _make_head(self, sensor: str) -> str:
        return head(self.m, "sensor", sensor)

    def _cached(
        self, cache: dict[str, T], make: Callable[[str], T], keys: Sequence[str]
    ) -> list[T]:
        """``[make(k) for k in keys]`` through ``cache`` (one C-level lookup when all hit)."""
        try:
            got = itemgetter(*keys)(cache)
            return list(got) if len(keys) > 1 else [got]
        except KeyError:
            for k in keys:
                if k not in cache:
                    cache[k] = make(k)
            return [cache[k] for k in keys]

    def _log_line(self, batch: Batch) -> str:
        """The write-log point of ``batch`` (see :mod:`.catalog`)."""
        counts = batch.counts
        nonempty = np.flatnonzero(counts)
        mins = np.minimum.reduceat(batch.timestamps_ns, batch.offsets[:-1][nonempty])
        hashes = np.array(self._cached(self._hashes, ic.name_hash, batch.sensors), np.int64)
        return self._log_point(hashes[nonempty], mins)

    def _log_point(self, hashes: Int64Array, mins: Int64Array) -> str:
        now = max(time.time_ns(), self._last_log_ns + 1)  # unique per writer
        self._last_log_ns = now
        summary = ic.summarise(hashes, mins)
        return f"{self.m}_writes,writer={self._writer_id} {summary.fields()} {now}\n"

    async def write(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        self._validate(batch)
        started = time.perf_counter()
        text = lines(
            self._cached(self._heads, self._make_head, batch.sensors),
            batch.counts.tolist(),
            batch.timestamps_ns,
            batch.values,
        )
        # The log line goes first: if the write fails half-way, modified_since
        # still (conservatively) reports it. A batch of several requests logs itself
        # again with its last one: a reader that computed virtual results from the
        # first parts must find a write newer than its computation.
        step = self.settings.write_lines
        rp = self.settings.retention_policy
        for i in range(0, len(text), step):
            part = "".join(text[i : i + step])
            if i == 0 or i + step >= len(text):
                part = self._log_line(batch) + part
            await self.http.write(part.encode(), rp)
        self.metrics.written.labels(self.kind).inc(len(batch))
        self.metrics.op_seconds.labels(self.kind, "write").observe(time.perf_counter() - started)

    def _select(self, sensor: str, start_ns: int, end_ns: int) -> str:
        return (
            f'SELECT "value" FROM {self._readings} WHERE "sensor" = '
            f"{string_literal(tag_value(sensor))} AND time >= {start_ns} AND time < {end_ns}"
        )

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        a, b = max(start_ns, MIN_TIME_NS), min(end_ns, MAX_TIME_NS + 1)
        if a >= b:
            return Series.empty(sensor)
        started = time.perf_counter()
        async with self._sem:
            ts, vs = await self.http.query_csv(
                self._select(sensor, a, b), lambda r: read_csv_stream(r.aiter_raw())
            )
        self.metrics.read_points.labels(self.kind).inc(ts.shape[0])
        self.metrics.op_seconds.labels(self.kind, "read").observe(time.perf_counter() - started)
        return Series(sensor, ts, vs)

    async def read_many(
        self, sensors: Sequence[str], start_ns: int, end_ns: int
    ) -> dict[str, Series]:
        unique = list(dict.fromkeys(sensors))
        got = await asyncio.gather(*(self.read(s, start_ns, end_ns) for s in unique))
        return dict(zip(unique, got, strict=True))

    async def latest(self, sensor: str) -> tuple[int, float] | None:
        res = await self.http.query(
            f'SELECT last("value") FROM {self._readings} WHERE "sensor" = '
            f"{string_literal(tag_value(sensor))}"
        )
        found = rows(res)
        if not found:
            return None
        r = found[-1][1]
        return int(r["time"]), float(decode_values(np.array([float(r["last"])]))[0])

    # ------------------------------------------------------------------ hierarchy
    async def _tag_values(self, where: str) -> list[str]:
        res = await self.http.query(
            f'SHOW TAG VALUES FROM "{self.m}", "{self.m}_meta" WITH KEY = "sensor"{where}'
        )
        return sorted({name_of_tag(r["value"]) for _, r in rows(res)})

    async def has_sensor(self, sensor: str) -> bool:
        return bool(
            await self._tag_values(f' WHERE "sensor" = {string_literal(tag_value(sensor))}')
        )

    async def sensors(self, prefix: str = "/") -> list[str]:
        where = "" if prefix == "/" else f' WHERE "sensor" =~ {prefix_regex(prefix)}'
        return [n for n in await self._tag_values(where) if names.is_under(n, prefix)]

    async def children(self, prefix: str = "/") -> list[Child]:
        return children_of(await self.sensors(prefix), prefix)

    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        res = await self.http.query(
            f'SELECT "base_min", "bloom", "late" FROM {self.catalog.data("writes")} '
            f"WHERE time > {max(since_ns, MIN_TIME_NS)}"
        )
        records = [(int(r["base_min"]), r["bloom"], r["late"]) for _, r in rows(res)]
        out = ic.earliest_written(records, sensors)
        pruned = await self.catalog.get_state("writes_pruned")
        if pruned is not None and since_ns < pruned:
            # Writes after since_ns may have left the log: answer conservatively.
            for s in sensors:
                first = await self._first_ts(s)
                if first is not None:
                    out[s] = min(out.get(s, first), first)
        return out

    async def _first_ts(self, sensor: str) -> int | None:
        res = await self.http.query(
            f'SELECT first("value") FROM {self._readings} WHERE "sensor" = '
            f"{string_literal(tag_value(sensor))}"
        )
        found = rows(res)
        return int(found[0][1]["time"]) if found else None

    # ------------------------------------------------------------------ retention
    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        a = await self._delete_readings(sensor, start_ns, end_ns)
        if a is not None:  # logged as a write from a on: virtual results from it go stale
            hashes = np.array([ic.name_hash(sensor)], np.int64)
            line = self._log_point(hashes, np.array([a], np.int64))
            await self.http.write(line.encode(), self.settings.retention_policy)
        return -1

    async def _delete_readings(self, sensor: str, start_ns: int, end_ns: int) -> int | None:
        """Delete without logging; returns the start of the range deleted (None: empty)."""
        a, b = max(start_ns, MIN_TIME_NS), min(end_ns, MAX_TIME_NS + 1)
        if a >= b:
            return None
        await self.http.query(
            f'DELETE FROM "{self.m}" WHERE "sensor" = {string_literal(tag_value(sensor))} '
            f"AND time >= {a} AND time < {b}",
            mutate=True,
        )
        return a

    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        where = "" if prefix == "/" else f'"sensor" =~ {prefix_regex(prefix)} AND '
        await self.http.query(
            f'DELETE FROM "{self.m}" WHERE {where}time < {min(ts_ns, MAX_TIME_NS + 1)}',
            mutate=True,
        )
        await self._prune_write_log()
        return -1

    async def apply_retention(self, now_ns: int) -> int:
        for meta in await self.list_metadata("/"):
            if meta.ttl_ms:
                await self._delete_readings(
                    meta.name, MIN_TIME_NS, now_ns - meta.ttl_ms * 1_000_000
                )
        await self._prune_write_log()
        return -1

    async def _prune_write_log(self) -> None:
        cutoff = time.time_ns() - int(self.settings.modified_log_s * 1e9)
        res = await self.http.query(
            f'SELECT last("base_min") FROM {self.catalog.data("writes")} WHERE time < {cutoff}'
        )
        found = rows(res)
        if found:
            await self.http.query(
                f'DELETE FROM "{self.m}_writes" WHERE time < {cutoff}', mutate=True
            )
            newest = int(found[-1][1]["time"])
            await self.catalog.set_state(
                "writes_pruned", max(newest, await self.catalog.get_state("writes_pruned") or 0)
            )

    async def stats(self) -> dict[str, Any]:
        s = self.settings
        db = identifier(s.database)

        async def count(q: str) -> int:
            return sum(int(r["count"]) for _, r in rows(await self.http.query(q)))

        policies = rows(await self.http.query(f"SHOW RETENTION POLICIES ON {db}"))
        return {
            "backend": self.kind,
            "url": mask_url(s.url),
            "server_version": self.http.version,
            "database": s.database,
            "retention_policy": s.retention_policy or "(default)",
            "retention_policies": {r["name"]: r["duration"] for _, r in policies},
            "sensors": await count(
                f'SHOW TAG VALUES EXACT CARDINALITY FROM "{self.m}" WITH KEY = "sensor"'
            ),
            "series": await count("SHOW SERIES EXACT CARDINALITY"),
            "virtual_sensors": len(await self.catalog.list_virtual()),
            "jobs": len(await self.catalog.jobs(None, None, None)),
        }
