"""The sharded backend: sensors spread over several backends by hierarchy prefix.

As DCDB maps sub-trees of the sensor hierarchy to Cassandra nodes, each
sensor lives on exactly one shard: the shard of the longest rule prefix it is
under, else the default shard. Readings, metadata, latest values and deletes
of a sensor go to its shard; listings, metadata lists, retention and
``modified_since`` fan out to the shards concerned and merge. Virtual-sensor
definitions, their stored results and jobs belong to no sub-tree and live on
the default shard.

Writes are at-least-once across shards: a batch is split per shard and the
parts are written concurrently; if one part fails the others may be stored,
and the caller's retry of the whole batch is idempotent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry

from services.common import names
from services.common.errors import (
    ConfigError,
    PermanentStorageError,
    SensorNameError,
    StorageError,
)
from services.common.readings import Batch, Float64Array, Int64Array, Series
from services.common.sensors import JobRecord, SensorMetadata
from services.common.storage.base import (
    Child,
    StorageBackend,
    VirtualResults,
    check_names,
    children_of,
)
from services.common.storage.metrics import StorageMetrics
from services.common.storage.settings import ShardedSettings, ShardSettings

T = TypeVar("T")


def _make(shard: ShardSettings, registry: CollectorRegistry | None) -> StorageBackend:
    if shard.backend == "sqlite":
        from services.common.storage.sqlite import SqliteStorage

        return SqliteStorage(shard.sqlite, registry)
    from services.common.storage.influxdb import InfluxStorage

    return InfluxStorage(shard.influxdb, registry)


def subset(batch: Batch, series: Sequence[int]) -> Batch:
    """The readings of the given series of ``batch``, in order."""
    idx = np.asarray(series, dtype=np.int64)
    counts = batch.counts[idx]
    offsets = np.zeros(idx.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    keep = np.repeat(np.isin(np.arange(batch.series_count), idx), batch.counts)
    return Batch(
        [batch.sensors[i] for i in idx.tolist()],
        offsets,
        batch.timestamps_ns[keep],
        batch.values[keep],
    )


class ShardedStorage(StorageBackend):
    """Routes by hierarchy prefix (see module docstring)."""

    kind: ClassVar[str] = "sharded"
    atomic_writes: ClassVar[bool] = False

    def __init__(
        self, settings: ShardedSettings, registry: CollectorRegistry | None = None
    ) -> None:
        if not settings.shards:
            raise ConfigError("storage.sharded.shards: at least one shard is required")
        shard_names = [s.name for s in settings.shards]
        if len(set(shard_names)) != len(shard_names):
            raise ConfigError(f"storage.sharded.shards: duplicate shard names in {shard_names}")
        self.default = settings.default or shard_names[0]
        for where, name in [("default", self.default)] + [
            (f"rules[{i}].shard", r.shard) for i, r in enumerate(settings.rules)
        ]:
            if name not in shard_names:
                raise ConfigError(
                    f"storage.sharded.{where}: unknown shard {name!r}; expected one of "
                    f"{', '.join(shard_names)}"
                )
        self.rules: list[tuple[str, str]] = []
        for i, r in enumerate(settings.rules):
            try:
                self.rules.append((names.validate_prefix(r.prefix), r.shard))
            except SensorNameError as exc:
                raise ConfigError(f"storage.sharded.rules[{i}].prefix: {exc}") from exc
        self.rules.sort(key=lambda r: -len(r[0]))  # longest prefix first
        self.shards: dict[str, StorageBackend] = {
            s.name: _make(s, registry) for s in settings.shards
        }
        self.metrics = StorageMetrics.of(registry)
        self._route: dict[str, str] = {}

    # ------------------------------------------------------------------ routing
    def shard_of(self, sensor: str) -> str:
        """Name of the shard holding ``sensor``: longest matching rule, else the default."""
        found = self._route.get(sensor)
        if found is None:
            found = next((s for p, s in self.rules if names.is_under(sensor, p)), self.default)
            if len(self._route) < 1_000_000:
                self._route[sensor] = found
        return found

    def shards_under(self, prefix: str) -> list[str]:
        """Shards that may hold sensors under ``prefix``."""
        out = {self.shard_of(prefix) if prefix != "/" else self.default}
        out.update(s for p, s in self.rules if names.is_under(p, prefix))
        return sorted(out)

    @property
    def home(self) -> StorageBackend:
        """The default shard: virtual sensors and jobs live here."""
        return self.shards[self.default]

    async def _all(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        """Await every call; if any failed, raise (permanent before retryable)."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if not isinstance(e, StorageError):
                raise e
        for e in errors:
            if isinstance(e, PermanentStorageError):
                raise e
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        try:
            await self._all([s.open() for s in self.shards.values()])
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.shards.values()), return_exceptions=True)

    async def ping(self) -> bool:
        return all(await asyncio.gather(*(s.ping() for s in self.shards.values())))

    # ------------------------------------------------------------------ readings
    async def write(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        try:
            check_names(batch.sensors, self.kind)
        except PermanentStorageError:
            self.metrics.errors.labels(self.kind, "bad_name").inc()
            raise
        groups: dict[str, list[int]] = {}
        for i, sensor in enumerate(batch.sensors):
            groups.setdefault(self.shard_of(sensor), []).append(i)
        if len(groups) == 1:
            (shard,) = groups
            await self.shards[shard].write(batch)
            return
        await self._all([self.shards[s].write(subset(batch, idx)) for s, idx in groups.items()])

    async def read(self, sensor: str, start_ns: int, end_ns: int) -> Series:
        return await self.shards[self.shard_of(sensor)].read(sensor, start_ns, end_ns)

    async def read_many(
        self, sensors: Sequence[str], start_ns: int, end_ns: int
    ) -> dict[str, Series]:
        groups: dict[str, list[str]] = {}
        for s in dict.fromkeys(sensors):
            groups.setdefault(self.shard_of(s), []).append(s)
        parts = await self._all(
            [self.shards[k].read_many(v, start_ns, end_ns) for k, v in groups.items()]
        )
        return {k: v for part in parts for k, v in part.items()}

    async def latest(self, sensor: str) -> tuple[int, float] | None:
        return await self.shards[self.shard_of(sensor)].latest(sensor)

    # ------------------------------------------------------------------ hierarchy
    async def has_sensor(self, sensor: str) -> bool:
        return await self.shards[self.shard_of(sensor)].has_sensor(sensor)

    async def sensors(self, prefix: str = "/") -> list[str]:
        shards = self.shards_under(prefix)
        parts = await self._all([self.shards[s].sensors(prefix) for s in shards])
        # A shard lists only what routes to it (a rule added later moves nothing).
        return sorted(
            {
                n
                for s, part in zip(shards, parts, strict=True)
                for n in part
                if self.shard_of(n) == s
            }
        )

    async def children(self, prefix: str = "/") -> list[Child]:
        return children_of(await self.sensors(prefix), prefix)

    # ------------------------------------------------------------------ metadata
    async def get_metadata(self, sensor: str) -> SensorMetadata | None:
        return await self.shards[self.shard_of(sensor)].get_metadata(sensor)

    async def put_metadata(self, meta: SensorMetadata) -> None:
        await self.shards[self.shard_of(meta.name)].put_metadata(meta)

    async def list_metadata(self, prefix: str = "/") -> list[SensorMetadata]:
        shards = self.shards_under(prefix)
        parts = await self._all([self.shards[s].list_metadata(prefix) for s in shards])
        metas = [
            m
            for s, part in zip(shards, parts, strict=True)
            for m in part
            if self.shard_of(m.name) == s
        ]
        return sorted(metas, key=lambda m: m.name)

    # ------------------------------------------------------------------ virtual sensors
    async def put_virtual(self, name: str, definition: dict[str, Any]) -> None:
        await self.home.put_virtual(name, definition)

    async def get_virtual(self, name: str) -> dict[str, Any] | None:
        return await self.home.get_virtual(name)

    async def list_virtual(self) -> dict[str, dict[str, Any]]:
        return await self.home.list_virtual()

    async def delete_virtual(self, name: str) -> bool:
        return await self.home.delete_virtual(name)

    async def write_virtual_results(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        timestamps_ns: Int64Array,
        values: Float64Array,
        computed_at_ns: int,
    ) -> None:
        await self.home.write_virtual_results(
            name, start_ns, end_ns, timestamps_ns, values, computed_at_ns
        )

    async def read_virtual_results(self, name: str, start_ns: int, end_ns: int) -> VirtualResults:
        return await self.home.read_virtual_results(name, start_ns, end_ns)

    async def invalidate_virtual(self, name: str, start_ns: int, end_ns: int) -> None:
        await self.home.invalidate_virtual(name, start_ns, end_ns)

    async def modified_since(self, sensors: Sequence[str], since_ns: int) -> dict[str, int]:
        groups: dict[str, list[str]] = {}
        for s in dict.fromkeys(sensors):
            groups.setdefault(self.shard_of(s), []).append(s)
        parts = await self._all(
            [self.shards[k].modified_since(v, since_ns) for k, v in groups.items()]
        )
        return {k: v for part in parts for k, v in part.items()}

    # ------------------------------------------------------------------ jobs
    async def put_job(self, job: JobRecord) -> None:
        await self.home.put_job(job)

    async def jobs(
        self, start_ns: int | None = None, end_ns: int | None = None, node: str | None = None
    ) -> list[JobRecord]:
        return await self.home.jobs(start_ns, end_ns, node)

    # ------------------------------------------------------------------ retention
    @staticmethod
    def _sum(counts: Sequence[int]) -> int:
        return -1 if any(c < 0 for c in counts) else sum(counts)

    async def delete_range(self, sensor: str, start_ns: int, end_ns: int) -> int:
        return await self.shards[self.shard_of(sensor)].delete_range(sensor, start_ns, end_ns)

    async def truncate_before(self, ts_ns: int, prefix: str = "/") -> int:
        shards = self.shards_under(prefix)
        return self._sum(
            await self._all([self.shards[s].truncate_before(ts_ns, prefix) for s in shards])
        )

    async def apply_retention(self, now_ns: int) -> int:
        return self._sum(await self._all([s.apply_retention(now_ns) for s in self.shards.values()]))

    async def stats(self) -> dict[str, Any]:
        parts = await self._all([s.stats() for s in self.shards.values()])
        return {
            "backend": self.kind,
            "default_shard": self.default,
            "rules": {p: s for p, s in sorted(self.rules)},
            "shards": dict(zip(self.shards, parts, strict=True)),
        }
