"""Settings of the query API (YAML section ``query_api``, env prefix ``KELVIN_QUERY_API_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class JobAccounting(BaseModel):
    """Per-job energy and cooling (``GET /api/v1/jobs``, ``kelvin jobs``)."""

    model_config = ConfigDict(extra="forbid")
    hall_file: Path | None = None
    """The hall whose CRAC model attributes cooling (the allocator's hall file; None = reference)."""
    power_sensor: str = "{node}/power"
    """A job node's power sensor (W); ``{node}`` is the name in the job record."""
    inlet_sensor: str = "{node}/inlet_temp"
    """A node's inlet temperature sensor (°C)."""
    allocator_prefix: str = "/kelvin/allocator"
    """The allocator's ``sensor_prefix``: ``<prefix>/placed/<policy>`` says who placed a job."""
    margin_s: float = Field(30.0, ge=0)
    """Readings this far outside a job are read to interpolate at its start and end."""
    grid_step_s: float = Field(1.0, gt=0)
    """Finest step of the cooling attribution."""
    max_jobs: int = Field(1000, ge=1)
    """Most jobs one report lists."""


class Settings(SectionSettings):
    """query API settings."""

    section: ClassVar[str] = "query_api"
    model_config = SettingsConfigDict(env_prefix="KELVIN_QUERY_API_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8080, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    storage_check_s: float = Field(5.0, gt=0)
    """How often storage is pinged for ``/readyz`` (and, while it is down at start, the
    longest wait between attempts to open it)."""
    allocator_url: str = "http://127.0.0.1:8083"
    """Allocator API (hall view of the console)."""
    collect_agent_url: str = "http://127.0.0.1:8081"
    """Collect agent API (ingest health in the console)."""
    default_range_s: float = Field(3600.0, gt=0)
    """Range read when a request names no start: ``now - default_range_s`` to now."""
    stream_chunk_points: int = Field(65_536, ge=1024)
    """Readings per chunk when streaming a response (memory per request stays bounded)."""
    stream_pieces: int = Field(8, ge=1, le=1024)
    """A plain readings request is read in up to this many time slices (fewer when they
    would be small, more when the memory budget needs them), read and encoded while
    earlier ones are sent (see services/query_api/stream.py)."""
    max_points: int = Field(50_000_000, ge=1)
    """Largest number of readings (or virtual grid points) one request may produce."""
    max_heavy_queries: int = Field(2, ge=1)
    """Data queries (readings, Grafana, Prometheus) running at once; more wait up to
    ``heavy_query_wait_s`` for a slot, then get 503 with Retry-After."""
    heavy_query_wait_s: float = Field(5.0, ge=0)
    """How long a data query waits for a free slot before it is refused."""
    response_memory_bytes: int = Field(512 << 20, ge=1 << 20)
    """Memory one data query's answer may hold (32 bytes per reading held); a larger
    answer is a 400 over_budget, stopped before it is read. A plain sensor's readings are
    streamed in slices and spill to a temporary file instead."""
    import_max_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    """Largest CSV body ``POST /api/v1/import`` accepts (``kelvin csvimport`` sends chunks)."""
    virtual_gap_factor: float = Field(3.0, ge=1.0)
    """A virtual sensor interpolates across a gap in an input only if the gap is at most
    this many of the input's own intervals (unless its definition sets ``max_gap_ms``)."""
    virtual_settle_s: float = Field(10.0, ge=0)
    """Results newer than ``now - virtual_settle_s`` are computed but not stored, because
    their inputs are probably still arriving."""
    virtual_memory_points: int = Field(5_000_000, ge=0)
    """Virtual-sensor results kept in memory (16 bytes each) in front of the stored ones."""
    virtual_max_depth: int = Field(8, ge=1)
    """Deepest nesting of virtual sensors on other virtual sensors."""
    virtual_sensors: dict[str, dict[str, Any]] = {}
    """Virtual sensors to define at start, name -> ``{expression, unit, interval_ms,
    max_gap_ms, description}``; retried every ``virtual_retry_s`` until their inputs exist.
    ``kelvin up --demo`` adds ``/hall/pue`` unless this names it."""
    virtual_retry_s: float = Field(10.0, gt=0)
    """How often configured virtual sensors whose inputs are missing are tried again."""
    prometheus_lookback_s: float = Field(300.0, gt=0)
    """Prometheus API: how far back an instant query looks for the latest reading."""
    prometheus_max_series: int = Field(10_000, ge=1)
    """Prometheus API: most series one selector may match."""
    prometheus_max_samples: int = Field(50_000_000, ge=1000)
    """Prometheus API: most samples one query may hold at once (Prometheus' ``query.max-samples``)."""
    rule_files: list[Path] = []
    """Prometheus-format rule files (recording and alerting rules) the query API evaluates."""
    builtin_rules: bool | None = None
    """Also evaluate the shipped hall rules (services/query_api/rules/hall.yaml);
    None = only under ``kelvin up --demo``."""
    rule_interval_s: float = Field(60.0, gt=0)
    """Evaluation interval of groups that set none (Prometheus' ``evaluation_interval``)."""
    alertmanager_urls: list[str] = []
    """Alertmanagers to send alerts to (``http://host:9093``; the v2 API). Empty: alerts are
    only shown (console, ``/prometheus/api/v1/alerts``)."""
    alert_resend_delay_s: float = Field(60.0, gt=0)
    """A firing alert is sent again at most this often (Prometheus' ``--rules.alert.resend-delay``)."""
    external_labels: dict[str, str] = {}
    """Labels added to every alert sent (``site: dc1``), and ``$externalLabels`` in templates."""
    external_url: str = "http://127.0.0.1:8080"
    """How users reach this query API; alerts link back to it."""
    rules_record_prefix: str = "/kelvin/rules"
    """Recording rules store their series under this prefix (``<prefix>/<name>/<label>=<value>``)."""
    self_metrics_retention_s: float = Field(900.0, ge=60)
    """How long scraped service metrics (collect agent, query API) are kept for rules."""
    jobs: JobAccounting = JobAccounting()
    """Per-job accounting from stored telemetry."""
