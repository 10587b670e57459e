"""Settings of the allocator (YAML section ``allocator``, env prefix ``KELVIN_ALLOCATOR_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import SectionSettings


class JobStream(BaseModel):
    """The seeded job generator (on under ``kelvin up --demo``; ``enabled: true`` anywhere)."""

    enabled: bool | None = None
    """None: on only under the demo profile."""
    mean_interval_s: float = Field(3.0, gt=0)
    """Mean time between submissions (exponential); 3 s keeps the simulated hall's hottest inlet
    under its redline under a thermal-aware policy most of the time, and a poor policy over it."""
    runtime_s: tuple[float, float] = (2.0, 10.0)
    """Job runtime, uniform in [low, high] seconds (stretched by Lf)."""
    sizes: tuple[int, int] = (1, 8)
    """Job size, uniform in [low, high] nodes (clipped to the hall)."""
    comm_share: float = Field(0.2, ge=0, le=1)
    """Communication share C of every generated job."""
    max_queued: int = Field(10, ge=0)
    """Skip a submission while this many jobs already wait (keeps the demo responsive)."""

    @model_validator(mode="after")
    def _ranges(self) -> JobStream:
        if not 0 < self.runtime_s[0] <= self.runtime_s[1]:
            raise ValueError("runtime_s must be [low, high] with 0 < low <= high")
        if not 1 <= self.sizes[0] <= self.sizes[1]:
            raise ValueError("sizes must be [low, high] with 1 <= low <= high")
        return self


class Reliability(BaseModel):
    """Junction-temperature and lifetime constants (spec section 6); defaults are the spec's."""

    model_config = ConfigDict(extra="forbid")

    t_hs_ref_c: float = Field(45.0, allow_inf_nan=False)
    """Heat-sink temperature at the reference inlet (°C)."""
    tin_ref_c: float = Field(15.0, allow_inf_nan=False)
    """Reference inlet temperature (°C)."""
    hs_slope: float = Field(0.6, ge=0, allow_inf_nan=False)
    """Heat-sink rise per kelvin of inlet rise."""
    r_ja_c_per_w: float = Field(0.1, ge=0, allow_inf_nan=False)
    """Junction-to-ambient thermal resistance (°C/W)."""
    active_proc_power_w: float = Field(120.0, ge=0, allow_inf_nan=False)
    """Power of an active processor (W)."""
    idle_proc_power_w: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Power of an idle processor (W); None = the active power scaled by the hall's idle/busy node power."""
    calib_temp_c: float = Field(60.0, allow_inf_nan=False)
    """Junction temperature at which a processor lives ``calib_mttf_years``."""
    calib_mttf_years: float = Field(5.0, gt=0, allow_inf_nan=False)


class Settings(SectionSettings):
    """allocator settings."""

    section: ClassVar[str] = "allocator"
    model_config = SettingsConfigDict(env_prefix="KELVIN_ALLOCATOR_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8083, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    state_dir: Path = Path("data/allocator")
    """Where placements, the queue, the policy and a fitted D persist across restarts."""
    brokers: list[str] = ["127.0.0.1:1883"]
    """MQTT endpoints to publish decisions as sensors (first reachable wins)."""
    query_api_url: str = "http://127.0.0.1:8080"
    """Query API, read by calibration."""
    policy: str = "joint"
    """Placement policy: mpit, mc1x1, joint, first-fit, random."""
    cluster: Literal["internal", "external"] = "internal"
    """internal: the allocator runs its own jobs (POST /api/v1/jobs, the demo's job stream);
    external: it follows a workload manager (the slurm bridge reports nodes and jobs to
    POST /api/v1/cluster/sync and takes the placements back; jobs end when the manager says)."""
    demo_seed: int = 1
    """Seed of the demo job stream (and of the random policy)."""
    hall_file: Path | None = None
    """Hall file (YAML/JSON + matrix); None = the reference hall."""
    min_mttf_years: float = Field(0.0, ge=0)
    """Reliability constraint: a job waits while placing it would bring any processor's MTTF below this (0 = off)."""
    runner_ups: int = Field(3, ge=0, le=20)
    """Alternatives every decision reports."""
    mpit_exact_max_free: int = Field(600, ge=0)
    """MPIT solves exactly (bounded search, HiGHS MILP as fallback) up to this many free nodes; the greedy heuristic above."""
    mpit_time_limit_s: float = Field(1.0, gt=0)
    """Time cap on MPIT's exact solver, all its steps together (at the cap: the better of its best answer so far and greedy)."""
    joint_max_centres: int = Field(16, ge=1)
    """Joint opens MC1x1 shells at no more than this many of MPIT's nodes (the most compact)."""
    sensor_prefix: str = "/kelvin/allocator"
    """Prefix of the decision sensors (max_tin_c, cooling_kw, utilization, ...)."""
    publish_nodes: bool = True
    """Also publish each node's predicted inlet as <node>/predicted_inlet_temp."""
    publish_interval_s: float = Field(10.0, gt=0)
    """Republish the current values this often (plus on every change)."""
    publish_buffer: int = Field(1000, ge=1)
    """Snapshots kept while the broker is unreachable (oldest dropped, counted)."""
    mqtt_qos: int = Field(1, ge=0, le=1)
    """QoS of the published sensors."""
    mqtt_username: str | None = None
    """Broker login for publishing (e.g. one of the collect agent's ``mqtt_users``); None = anonymous."""
    mqtt_password: str | None = None
    """Password of ``mqtt_username`` (set it through ``KELVIN_ALLOCATOR_MQTT_PASSWORD``)."""
    mqtt_password_file: Path | None = None
    """File holding the password when ``mqtt_password`` is unset (the chart's init container
    writes the allocator's derived password there)."""
    mqtt_tls: bool = False
    """Publish over TLS, verifying the brokers' certificates."""
    mqtt_tls_ca: Path | None = None
    """CA bundle (PEM) to verify the brokers with (None: the system's CAs)."""
    history: int = Field(200, ge=0)
    """Finished jobs kept for GET /api/v1/jobs?state=finished."""
    sensor_map: dict[str, Any] | None = None
    """Each node's measured sensors, {power: TEMPLATE|[names], inlet_temp: ...} (and the hall's {supply_temp: NAME}), read by calibration and shown by the console's hall view; None = the default node sensors."""
    job_stream: JobStream = JobStream()
    """The seeded demo job generator."""
    reliability: Reliability = Reliability()
    """Constants of the MTTF model behind ``min_mttf_years``."""
