"""Storage configuration: which backend, and how to reach it.

YAML section ``storage``; env prefix ``KELVIN_STORAGE_`` (nested with ``__``,
e.g. ``KELVIN_STORAGE_INFLUXDB__URL``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class SqliteSettings(BaseModel):
    """The embedded default: one SQLite file in WAL mode."""

    model_config = ConfigDict(extra="forbid")

    path: Path = Path("data/kelvin.sqlite")
    """Database file; its directory is created if missing."""
    synchronous: Literal["OFF", "NORMAL", "FULL"] = "NORMAL"
    """SQLite ``synchronous`` pragma: NORMAL is crash-safe in WAL mode (may lose the last commit on power loss)."""
    busy_timeout_ms: int = Field(10_000, ge=0)
    """How long a writer waits for the lock before raising a retryable error."""
    reader_threads: int = Field(2, ge=1, le=32)
    """Threads (each with its own connection) serving reads; writes have one thread."""
    compact_readings: int = Field(1_048_576, ge=1)
    """Compact staged writes into per-sensor chunks once they hold this many readings
    (larger: fewer, bigger level-0 chunks per sensor; measured 2x faster ingest for
    10k sensors than 262144)."""
    compact_writes: int = Field(256, ge=1)
    """... or once this many writes are staged (many tiny batches)."""
    modified_log_s: float = Field(86_400.0, gt=0)
    """How long the log behind ``modified_since`` is kept; older questions get a
    conservative answer (each sensor's earliest reading)."""


class InfluxSettings(BaseModel):
    """An InfluxDB 1.x server, or 2.x/3.x through their v1-compatible endpoints."""

    model_config = ConfigDict(extra="forbid")

    url: str = "http://127.0.0.1:8086"
    database: str = "kelvin"
    retention_policy: str | None = None
    """None = the database's default policy."""
    catalog_retention_policy: str | None = "autogen"
    """Policy holding records that must never expire (metadata, virtual sensor
    definitions, jobs); keep it infinite. None = the database's default policy."""
    retention_duration: str | None = None
    """With ``retention_policy``: create that policy with this InfluxQL duration
    (``30d``, ``52w``, ``INF``) on open if it is missing."""
    username: str | None = None
    password: str | None = None
    token: str | None = None
    """2.x/3.x token (sent as ``Authorization: Token ...``)."""
    org: str | None = None
    """2.x organisation, used only to create the bucket ``<database>/<policy>``."""
    create_database: bool = True
    """Create the database (1.x; the bucket on 2.x; 3.x creates it on first write)."""
    timeout_s: float = Field(10.0, gt=0)
    retries: int = Field(5, ge=0)
    """Attempts for a retryable failure before raising RetryableStorageError."""
    backoff_s: float = Field(0.2, gt=0)
    """First wait before a retry; doubles each attempt (with jitter)."""
    backoff_max_s: float = Field(5.0, gt=0)
    """Longest wait between two attempts."""
    measurement: str = "kelvin"
    """Measurement holding readings; the sensor name is a tag. Metadata, virtual
    sensors, jobs and the write log live in ``<measurement>_meta``, ``_vdef``,
    ``_vpoints``, ``_vranges``, ``_jobs``, ``_writes`` of the same database."""
    write_lines: int = Field(50_000, ge=100)
    """Readings per HTTP write request (a batch is split into requests of this size)."""
    concurrency: int = Field(4, ge=1, le=64)
    """Requests in flight at once for multi-sensor reads."""
    modified_log_s: float = Field(86_400.0, gt=0)
    """How long the write log behind ``modified_since`` is kept (pruned by retention)."""


class ClickHouseSettings(BaseModel):
    """A ClickHouse server, or a cluster of them (replicated, sharded)."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] = ["http://127.0.0.1:8123"]
    """HTTP endpoints (``http(s)://host:8123``). Several: any node of the cluster,
    tried in order (the next one when a node is down)."""
    database: str = "kelvin"
    """Database holding every Kelvin table (created on open with ``create_tables``)."""
    cluster: str | None = None
    """Name of the cluster in the servers' ``<remote_servers>``: tables are
    ``Replicated*MergeTree`` on every node plus a ``Distributed`` table over them.
    None = one server, plain ``*MergeTree`` tables."""
    username: str = "default"
    """ClickHouse user (sent as ``X-ClickHouse-User``)."""
    password: str = ""
    """Its password (``X-ClickHouse-Key``); prefer ``KELVIN_STORAGE_CLICKHOUSE__PASSWORD``."""
    create_tables: bool = True
    """Create the database and tables on open (``ON CLUSTER`` in cluster mode);
    False = only check that they exist (a DBA created them)."""
    table: str = "readings"
    """Readings table; the catalog tables are ``<table>_meta``, ``_vdef``,
    ``_vpoints``, ``_vranges``, ``_jobs``, ``_writes``, ``_state``, the rollups
    ``<table>_1m`` and ``<table>_1h`` (cluster mode: each ``..._local`` + Distributed)."""
    zookeeper_path: str = "/clickhouse/tables/{shard}/{database}/{table}"
    """Replicated tables' ZooKeeper path (``{shard}`` is the server's macro)."""
    replica_name: str = "{replica}"
    """Replica name of the replicated tables (``{replica}`` is the server's macro)."""
    insert_quorum: int = Field(0, ge=0)
    """Cluster mode: replicas that must hold an insert before it is acknowledged
    (0 = no quorum; 2 = an acknowledged write survives the loss of one replica)."""
    insert_quorum_timeout_s: float = Field(60.0, gt=0)
    """How long an insert waits for its quorum before failing (retryably)."""
    timeout_s: float = Field(30.0, gt=0)
    """HTTP timeout of one request."""
    retries: int = Field(3, ge=0)
    """Attempts of a retryable failure (on the next URL) before RetryableStorageError."""
    backoff_s: float = Field(0.1, gt=0)
    """First wait before a retry; doubles each attempt (with jitter)."""
    backoff_max_s: float = Field(2.0, gt=0)
    """Longest wait between two attempts."""
    insert_rows: int = Field(1_000_000, ge=1_000)
    """Readings per INSERT request (a larger batch goes out in several)."""
    concurrency: int = Field(4, ge=1, le=64)
    """Requests in flight at once for multi-sensor reads."""
    raw_ttl_s: float | None = Field(None, gt=0)
    """Keep raw readings this long (table TTL where the server supports it, else
    deleted by ``apply_retention``); None = forever. The rollups stay."""
    rollups: bool = True
    """Per-minute and per-hour min/max/sum/count tables kept by materialized views;
    resampled reads use them when the step allows."""
    rollup_ttl_s: float | None = Field(None, gt=0)
    """Keep the per-minute rollup this long (the hourly one is kept forever); None = forever."""
    modified_log_s: float = Field(86_400.0, gt=0)
    """How long the write log behind ``modified_since`` is kept."""
    mutation_timeout_s: float = Field(120.0, gt=0)
    """How long a delete waits for the server to finish its mutation."""


class StorageSettings(SectionSettings):
    """Which storage backend every service uses."""

    section: ClassVar[str] = "storage"
    model_config = SettingsConfigDict(env_prefix="KELVIN_STORAGE_")

    backend: Literal["sqlite", "influxdb", "clickhouse"] = "sqlite"
    sqlite: SqliteSettings = SqliteSettings()
    influxdb: InfluxSettings = InfluxSettings()
    clickhouse: ClickHouseSettings = ClickHouseSettings()
