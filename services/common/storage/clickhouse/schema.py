"""The tables of the ClickHouse backend, as DDL for the server at hand.

One server: plain ``*MergeTree`` tables. A cluster: every table is a
``Replicated*MergeTree`` on every node (``ON CLUSTER``, ZooKeeper path with the
``{shard}`` macro) named ``<t>_local``, plus a ``Distributed`` table ``<t>``
over them sharded by ``cityHash64`` of the sensor (or catalog key), so one
sensor lives on one shard and ``FINAL`` deduplicates it there.

| table | engine | key | holds |
|---|---|---|---|
| ``<p>`` | ReplacingMergeTree | (sensor, ts) | readings (last insert wins) |
| ``<p>_1m``, ``<p>_1h`` | AggregatingMergeTree | (sensor, t) | min/max/sum/count states per minute/hour |
| ``<p>_meta`` | ReplacingMergeTree(version) | sensor | SensorMetadata JSON |
| ``<p>_vdef`` | ReplacingMergeTree(version) | name | virtual definitions (deleted flag) |
| ``<p>_vpoints`` | ReplacingMergeTree(version) | (name, ts) | virtual results (deleted flag) |
| ``<p>_vranges`` | ReplacingMergeTree(version) | (name, start_ns) | covered ranges (deleted flag) |
| ``<p>_jobs`` | ReplacingMergeTree(version) | (domain_id, job_id) | job records |
| ``<p>_writes`` | MergeTree | written_at | the write log behind modified_since |
| ``<p>_state`` | ReplacingMergeTree(version) | key | small integers (log pruned up to) |
| ``<p>_names`` | ReplacingMergeTree(version) | sensor | every sensor name Kelvin wrote (listings) |

Servers from 20.1 on get ``LowCardinality(String)`` names, ``Delta, ZSTD`` on
timestamps, ``ZSTD`` on values and table TTLs; 18.16 (Debian) gets plain
columns, and retention by ``ALTER ... DELETE`` instead of TTL.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.storage.clickhouse.native import literal
from services.common.storage.settings import ClickHouseSettings

MODERN = (20, 1)
"""First version whose codecs, LowCardinality and TTL Kelvin relies on."""
MINUTE_NS = 60 * 10**9
HOUR_NS = 3600 * 10**9
ROLLUPS = {"1m": MINUTE_NS, "1h": HOUR_NS}
_WEEK_NS = 7 * 86400 * 10**9


@dataclass(frozen=True, slots=True)
class Features:
    codecs: bool
    low_cardinality: bool
    ttl: bool

    @classmethod
    def of(cls, version: tuple[int, ...]) -> Features:
        modern = version[:2] >= MODERN
        return cls(codecs=modern, low_cardinality=modern, ttl=modern)


def floor_to(col: str, step: int) -> str:
    """SQL: ``col`` floored to a multiple of ``step`` (numpy's ``//`` rule, negatives too)."""
    return f"(intDiv({col}, {step}) - if({col} % {step} < 0, 1, 0)) * {step}"


def ttl_clause(col: str, seconds: float) -> str:
    # DateTime is 32-bit unsigned: clamp so that far-future readings never wrap to 1970.
    return (
        f" TTL toDateTime(greatest(0, least(intDiv({col}, 1000000000), 4294967295)))"
        f" + INTERVAL {int(seconds)} SECOND"
    )


class Schema:
    """Names and DDL of every table for one settings + server version."""

    def __init__(self, settings: ClickHouseSettings, version: tuple[int, ...]) -> None:
        self.s = settings
        self.f = Features.of(version)
        self.db = settings.database
        self.p = settings.table

    @property
    def clustered(self) -> bool:
        return self.s.cluster is not None

    def name(self, suffix: str = "") -> str:
        """The table reads and inserts go to (Distributed in cluster mode)."""
        return f"{_ident(self.db)}.{_ident(self.p + suffix)}"

    def local(self, suffix: str = "") -> str:
        """The table that stores (``_local`` in cluster mode)."""
        t = self.p + suffix + ("_local" if self.clustered else "")
        return f"{_ident(self.db)}.{_ident(t)}"

    def on_cluster(self) -> str:
        return f" ON CLUSTER {_ident(self.s.cluster)}" if self.s.cluster else ""

    def _engine(self, kind: str, suffix: str, args: str = "") -> str:
        if not self.clustered:
            return f"{kind}MergeTree({args})"
        path = self.s.zookeeper_path.format(
            shard="{shard}", database=self.db, table=self.p + suffix
        )
        extra = f", {args}" if args else ""
        return f"Replicated{kind}MergeTree({literal(path)}, {literal(self.s.replica_name)}{extra})"

    def _string(self) -> str:
        return "LowCardinality(String)" if self.f.low_cardinality else "String"

    def _codec(self, codec: str) -> str:
        return f" CODEC({codec})" if self.f.codecs else ""

    def _table(
        self, suffix: str, columns: str, engine: str, rest: str, shard_key: str
    ) -> list[str]:
        out = [
            f"CREATE TABLE IF NOT EXISTS {self.local(suffix)}{self.on_cluster()} ({columns}) "
            f"ENGINE = {engine} {rest}"
        ]
        if self.clustered:
            local = _ident(self.p + suffix + "_local")
            out.append(
                f"CREATE TABLE IF NOT EXISTS {self.name(suffix)}{self.on_cluster()} "
                f"AS {self.local(suffix)} ENGINE = Distributed({_ident(self.s.cluster)}, "
                f"{_ident(self.db)}, {local}, cityHash64({shard_key}))"
            )
        return out

    def ddl(self) -> list[str]:
        """Every statement that creates the database and tables (idempotent)."""
        s, name = self.s, self._string()
        out = [f"CREATE DATABASE IF NOT EXISTS {_ident(self.db)}{self.on_cluster()}"]
        ttl = ttl_clause("ts", s.raw_ttl_s) if s.raw_ttl_s and self.f.ttl else ""
        out += self._table(
            "",
            f"sensor {name}, ts Int64{self._codec('Delta, ZSTD')}, "
            f"value Float64{self._codec('ZSTD')}",
            self._engine("Replacing", ""),
            f"PARTITION BY intDiv(ts, {_WEEK_NS}) ORDER BY (sensor, ts){ttl}",
            "sensor",
        )
        if s.rollups:
            for suffix, step in ROLLUPS.items():
                rttl = ""
                if suffix == "1m" and s.rollup_ttl_s and self.f.ttl:
                    rttl = ttl_clause("t", s.rollup_ttl_s)
                out += self._table(
                    f"_{suffix}",
                    f"sensor {name}, t Int64{self._codec('Delta, ZSTD')}, "
                    "mn AggregateFunction(min, Float64), mx AggregateFunction(max, Float64), "
                    "sm AggregateFunction(sum, Float64), cnt AggregateFunction(count)",
                    self._engine("Aggregating", f"_{suffix}"),
                    f"PARTITION BY intDiv(t, {step * 24 * 30}) ORDER BY (sensor, t){rttl}",
                    "sensor",
                )
                out.append(
                    f"CREATE MATERIALIZED VIEW IF NOT EXISTS {self.local(f'_{suffix}_mv')}"
                    f"{self.on_cluster()} TO {self.local(f'_{suffix}')} AS SELECT sensor, "
                    f"{floor_to('ts', step)} AS t, minState(value) AS mn, maxState(value) AS mx, "
                    f"sumState(value) AS sm, countState() AS cnt FROM {self.local()} "
                    "WHERE NOT isNaN(value) GROUP BY sensor, t"
                )
        v = "version UInt64"
        catalog = [
            ("_meta", f"sensor String, json String, {v}", "sensor", "sensor"),
            ("_vdef", f"name String, json String, deleted UInt8, {v}", "name", "name"),
            (
                "_vpoints",
                f"name String, ts Int64, value Float64, deleted UInt8, {v}",
                "(name, ts)",
                "name",
            ),
            (
                "_vranges",
                f"name String, start_ns Int64, end_ns Int64, computed_at Int64, deleted UInt8, {v}",
                "(name, start_ns)",
                "name",
            ),
            (
                "_jobs",
                f"domain_id String, job_id String, start_ns Int64, end_ns Int64, "
                f"user_id String, nodes String, {v}",
                "(domain_id, job_id)",
                "job_id",
            ),
            ("_state", f"key String, value Int64, {v}", "key", "key"),
            ("_names", f"sensor String, {v}", "sensor", "sensor"),
        ]
        for suffix, cols, key, shard in catalog:
            out += self._table(
                suffix, cols, self._engine("Replacing", suffix, "version"), f"ORDER BY {key}", shard
            )
        wttl = ttl_clause("written_at", s.modified_log_s) if self.f.ttl else ""
        out += self._table(
            "_writes",
            "written_at Int64, sensor String, min_ts Int64",
            self._engine("", "_writes"),
            f"PARTITION BY intDiv(written_at, {86400 * 10**9}) ORDER BY written_at{wttl}",
            "sensor",
        )
        return out

    def tables(self) -> list[str]:
        """Names (without database) that must exist on the node Kelvin talks to."""
        suffixes = ["", "_meta", "_vdef", "_vpoints", "_vranges", "_jobs", "_state", "_writes"]
        suffixes.append("_names")
        if self.s.rollups:
            suffixes += [f"_{k}" for k in ROLLUPS]
        out = [self.p + x for x in suffixes]
        if self.clustered:
            out += [self.p + x + "_local" for x in suffixes]
        return out


def _ident(name: str | None) -> str:
    assert name is not None
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
