"""Settings of the collect agent (YAML section ``collect_agent``, env prefix ``KELVIN_COLLECT_AGENT_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from services.collect_agent.mqtt_auth import MqttAcl
from services.common.settings import SectionSettings


class BrokerSettings(BaseModel):
    """External-broker mode: subscribe to a v5 broker with a shared subscription."""

    model_config = ConfigDict(extra="forbid")

    host: str
    """Broker host (mosquitto, EMQX, HiveMQ, ... anything speaking MQTT v5)."""
    port: int = Field(1883, ge=1, le=65535)
    group: str = "kelvin"
    """Share name: agents with the same group split the stream (``$share/<group>/...``)."""
    prefixes: list[str] = ["/"]
    """Sensor prefixes to take (``/`` = everything); each becomes ``$share/<group>/<prefix>/#``."""
    client_id: str | None = None
    """Stable MQTT client id; None = ``kelvin-agent-<hostname>``. Keep it stable across
    restarts: the broker redelivers unacknowledged messages to the same id."""
    username: str | None = None
    password: str | None = None
    session_expiry_s: int = Field(3600, ge=0)
    """How long the broker keeps this agent's session (and its unacknowledged messages)
    while it is away."""
    tls: bool = False
    """Connect with TLS (system CA store)."""
    keepalive_s: int = Field(30, ge=5)


class Settings(SectionSettings):
    """Collect agent: MQTT endpoint and/or broker subscription, spool, writer, REST."""

    section: ClassVar[str] = "collect_agent"
    model_config = SettingsConfigDict(env_prefix="KELVIN_COLLECT_AGENT_")

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8081, ge=0, le=65535)
    """HTTP port (0 = any free port): REST, ``/write``, ``/ping``, ``/metrics``."""

    # ---------------------------------------------------------------- built-in MQTT endpoint
    mqtt_enabled: bool = True
    """Run the built-in MQTT endpoint (pushers connect to the agent directly)."""
    mqtt_host: str | None = None
    """MQTT bind address (None = same as ``host``)."""
    mqtt_port: int = Field(1883, ge=0, le=65535)
    """Built-in MQTT endpoint port (0 = any free port)."""
    mqtt_users: dict[str, str] = {}
    """Static MQTT users, name -> password (a site's DCDB pushers, tools): *node* users,
    held to ``mqtt_acl``."""
    mqtt_node_secret: str | None = None
    """Derived per-node passwords: any user name whose password is
    HMAC-SHA256(secret, ``kelvin-mqtt:`` + name) logs in as a node user (the chart's
    pushers; see ``services/common/mqtt_credentials.py``)."""
    mqtt_anonymous: bool | None = None
    """Accept CONNECTs without credentials, with every right. None = only while no
    credential is configured at all (no ``mqtt_users``, node secret or Kelvin token).
    Kelvin's write token (as the password, any user name) publishes like ``/write``,
    its admin token anything."""
    mqtt_acl: MqttAcl = MqttAcl()
    """Which topics each identity may publish (denied: PUBACK 0x87, never stored)."""
    mqtt_tls_cert: Path | None = None
    """PEM certificate chain: when set (with ``mqtt_tls_key``) the endpoint speaks TLS only."""
    mqtt_tls_key: Path | None = None
    connect_timeout_s: float = Field(10.0, gt=0)
    """A connection that sends no CONNECT within this time is closed."""
    max_connections: int = Field(10_000, ge=1)
    """Further connections are refused (CONNACK 'server unavailable', or closed at
    accept); capped below RLIMIT_NOFILE (raised to its hard limit at start)."""
    max_payload_bytes: int = Field(4 << 20, ge=1024, le=256 << 20)
    """Largest accepted MQTT packet / HTTP body; larger ones are skipped and counted."""
    mqtt_connect_max_bytes: int = Field(8 << 10, ge=256, le=1 << 20)
    """Largest first packet (the CONNECT): nothing bigger is buffered before credentials."""
    mqtt_partial_budget_bytes: int = Field(64 << 20, ge=1 << 20)
    """Memory for partially received packets, all connections together (at least twice
    ``max_payload_bytes``); past it connections wait, and past a quarter more are closed."""
    mqtt_stall_timeout_s: float = Field(30.0, gt=0)
    """A connection half-way through a packet that sends nothing for this long is
    closed, whatever its keep-alive (also 0)."""
    mqtt_max_sessions: int = Field(10_000, ge=1)
    """MQTT sessions kept (QoS 2 state of persistent and MQTT 5 expiring sessions)."""
    mqtt_session_expiry_max_s: float = Field(86_400.0, ge=0)
    """Longest MQTT 5 Session Expiry Interval granted (the CONNACK says when capped)."""

    # ---------------------------------------------------------------- spreading connections
    mqtt_peers: list[str] = []
    """HTTP base URLs of the other agents (``http://agent-1:8081``): an agent above its
    fair share of the connections asks some to move (DISCONNECT 0x9C)."""
    mqtt_peers_dns: str | None = None
    """A DNS name resolving to every agent (the StatefulSet's headless Service); its
    addresses other than this host's are peers on this agent's HTTP ``port``."""
    mqtt_rebalance_interval_s: float = Field(5.0, gt=0)
    """How often peers' connection counts are read."""
    mqtt_rebalance_per_s: float = Field(20.0, gt=0)
    """Most clients asked to move per second (rebalancing and connection age together)."""
    mqtt_rebalance_tolerance: float = Field(0.1, ge=0, le=1)
    """Connections above the fair share tolerated, as a fraction of it (at least 1)."""
    mqtt_max_connection_age_s: float | None = Field(None, gt=0)
    """Ask clients connected longer than this (plus up to 10 % jitter) to reconnect;
    None = never."""

    # ---------------------------------------------------------------- external broker
    broker: BrokerSettings | None = None
    """Subscribe to this broker too (external-broker mode). Set ``mqtt_enabled: false``
    to use the broker only."""

    # ---------------------------------------------------------------- spool
    spool_dir: Path = Path("data/spool")
    """Write-ahead spool directory (one per agent; keep it on a persistent volume)."""
    fsync: Literal["commit", "interval", "off"] = "commit"
    """``commit``: each group commit is fsync'ed before its acks go out (survives power
    loss). ``interval``: written before the acks (survives a killed agent), fsync'ed every
    ``fsync_interval_ms``. ``off``: never fsync'ed (tests, throw-away data)."""
    fsync_interval_ms: int = Field(1000, ge=1)
    commit_delay_ms: float = Field(0.0, ge=0, le=50)
    """Extra wait before a group commit to gather more publishes (0 = commit as soon as
    the previous commit is done; group commits then form by themselves under load)."""
    spool_max_bytes: int = Field(1 << 30, ge=1 << 20)
    """Disk quota of the spool; when reached, the agent stops reading publishes
    (back-pressure) until the writer has drained some."""
    spool_segment_bytes: int = Field(64 << 20, ge=1 << 16)
    """Size at which the spool starts a new segment file (drained segments are deleted)."""
    spool_memory_bytes: int = Field(256 << 20, ge=1 << 20)
    """Spooled readings also kept in memory for the writer; beyond this it reads them back."""

    # ---------------------------------------------------------------- writer
    writer_batch_readings: int = Field(200_000, ge=1)
    """Most readings handed to storage in one write."""
    writer_retry_max_s: float = Field(5.0, gt=0)
    """Longest back-off between retries while storage is failing."""
    drain_timeout_s: float = Field(20.0, ge=0)
    """On SIGTERM, how long the agent keeps writing its spool to storage (retrying while
    storage fails) after it stopped taking data; then it exits 0 and what is left stays
    in ``spool_dir``. The chart sets it to the pod's grace period less a margin."""
    spool_peers_dir: Path | None = None
    """A directory holding the spool directories of every agent (a shared volume, one
    directory per agent, ``spool_dir`` among them): an agent drains a sibling that no
    agent holds (its agent was scaled down or deleted) into storage. None = off."""
    orphan_scan_s: float = Field(10.0, gt=0)
    """How often ``spool_peers_dir`` is looked at for spools that outlived their agent."""
    spool_lock_wait_s: float = Field(30.0, ge=0)
    """At start, how long to wait for the own spool directory while another process holds
    it (an agent draining it as an orphan hands it back when asked)."""
    spool_ephemeral: bool = False
    """The spool is on a volume that dies with the pod (an emptyDir): the drain then logs
    what a pod deletion loses. The chart sets it."""
    metadata_refresh_s: float = Field(30.0, gt=0)
    """How often the sensors' scales are re-read from storage (metadata another agent
    received)."""
    scales_wait_s: float = Field(5.0, ge=0)
    """At start, how long to wait for storage to give the sensors' scales before taking
    publishes (DCDB integers are scaled on arrival); storage down: start after this."""

    # ---------------------------------------------------------------- cache and HTTP ingest
    cache_window_s: float = Field(900.0, ge=0)
    """Sensor cache window for latest values and averages (DCDB ``cacheInterval``);
    0 disables the cache."""
    cache_max_points: int = Field(1024, ge=2)
    influx_prefix: str = "/influx"
    """HTTP ``/write``: a line ``m,tag=v f=1`` becomes ``<influx_prefix>/m/v/f``."""
    influx_measurements: dict[str, str] = {}
    """measurement -> sensor prefix, overriding ``<influx_prefix>/<measurement>``."""
    remote_write_prefix: str = "/prometheus"
    """Prometheus remote write: a series without a ``sensor`` label is stored as
    ``<remote_write_prefix>/<metric>/<label>=<value>/...`` (docs/collect-agent.md)."""
    self_sensors_s: float | None = Field(None, ge=0)
    """Store the agent's own rates (readings/s in and out, spool depth, rejects) as sensors
    every this many seconds, so their history is queryable like any other (0 = off; None =
    every 5 s under ``kelvin up``, off under ``kelvin run``, where a reading count may
    matter to whoever counts: set it there to have them)."""
    self_sensors_prefix: str | None = None
    """Their names' prefix (None = ``/kelvin/collect_agent/<short hostname>``)."""
