"""Settings of the pusher (YAML section ``pusher``, env prefix ``KELVIN_PUSHER_``).

Global keys here; one sub-section per plugin instance under ``plugins``, each
validated by its plugin's own model (see :mod:`services.pusher.config`). Light
models (:class:`services.common.config.SectionModel`): the same YAML, env and
flag precedence and the same error messages as the other services'
pydantic-settings models, without pydantic in a compute node's pusher. The
shared ``auth`` section is :class:`services.common.auth_settings.AuthSettings`
(light too).
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, ClassVar, Literal

from services.common import names
from services.common.config import SectionModel
from services.common.schema import Field, field_validator


def short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class Settings(SectionModel):
    """pusher settings."""

    section: ClassVar[str] = "pusher"

    host: str = "0.0.0.0"
    """HTTP bind address."""
    port: int = Field(8082, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    brokers: list[str] = ["127.0.0.1:1883"]
    """MQTT endpoints (host:port), tried in order (failover)."""
    allocator_url: str = "http://127.0.0.1:8083"
    """Allocator API for the simulated-hall plugin."""
    state_dir: Path = Path("data/pusher")
    """Where plugins keep state between runs."""

    prefix: str | None = None
    """Sensor-name prefix of this node (default ``/<short hostname>``)."""
    client_id: str | None = None
    """MQTT client id (default ``kelvin-pusher-<host>-<random>``)."""
    mqtt_username: str | None = None
    mqtt_password: str | None = None
    mqtt_password_file: Path | None = None
    """File holding the MQTT password when ``mqtt_password`` is unset (the chart's init
    container writes this node's derived password there)."""
    mqtt_tls: bool = False
    """Connect to the brokers with TLS (verifying their certificates)."""
    mqtt_tls_ca: Path | None = None
    """CA bundle (PEM) to verify the brokers with (None: the system's CAs)."""
    mqtt_tls_server_name: str | None = None
    """Name the brokers' certificates must carry (None: the host of each broker address)."""
    mqtt_version: Literal["auto", "5", "3.1.1"] = "auto"
    """MQTT protocol: ``auto`` = 5, and 3.1.1 with a broker that refuses 5."""
    format: Literal["kvb1", "dcdb"] = "kvb1"
    """Wire format: Kelvin's batched KVB1 or DCDB's one PUBLISH per sensor."""
    qos: Literal[0, 1] = 1
    """MQTT QoS of readings (1: resent after a reconnect until acknowledged)."""
    push: Literal["continuous", "bursty"] = "continuous"
    """Send after every read, or in bursts every ``burst_interval_ms``."""
    burst_interval_ms: int = Field(30_000, ge=100)
    """Period of bursty sending (ms); each node's bursts are offset by its client id."""
    announce_metadata: bool = True
    """Publish ``/DCDB_MAP/METADATA/...`` for sensors with ``publish: true`` at connect."""
    buffer_readings: int = Field(2_000_000, ge=1)
    """Readings held while no broker is reachable (~9 bytes each); the oldest drop past it."""
    max_inflight: int = Field(64, ge=1, le=65535)
    """Unacknowledged QoS 1 messages at a time."""
    batch_max_bytes: int = Field(1 << 20, ge=1024)
    """Largest KVB1 payload; bigger groups are split."""
    keepalive_s: int = Field(30, ge=5)
    reconnect_max_s: float = Field(5.0, gt=0)
    """Longest wait between connect attempts (backoff from 0.2 s, with full jitter)."""
    reconnect_jitter_s: float = Field(1.0, ge=0)
    """Longest wait before reconnecting when a broker asks its clients to move
    (MQTT 5 DISCONNECT 0x8B, 0x9C, 0x9D)."""
    flush_timeout_s: float = Field(5.0, ge=0)
    """How long ``stop`` waits for buffered readings to go out."""
    keep_unsent: bool = True
    """Readings still unsent at stop go to ``<state_dir>/unsent.bin`` and out at the next start."""
    timestamps: Literal["tick", "read"] = "tick"
    """Stamp readings with the scheduled instant (aligned across nodes) or the read time."""
    cache_s: float = Field(300.0, ge=0)
    """Sensor cache window (DCDB ``cacheInterval``, 900 there), seconds: 8 bytes per reading."""
    cache_max_points: int = Field(1024, ge=2)
    """Cap on cached readings per sensor (bounds memory at short intervals)."""
    token: str | None = None
    """An admin token of this pusher's REST API, besides ``auth.admin_token``."""
    auth_reads: bool = False
    """Require a read token on read-only REST calls even where reads would be open."""
    file_roots: list[str] | None = None
    """Directories a plugin section loaded over REST may read files under (None: /proc,
    /sys and every plugin ``root`` of the configuration file)."""
    rest_hosts: list[str] | None = None
    """Hosts a ``rest`` plugin section loaded over REST may fetch from (None: the hosts
    of the ``rest`` endpoints of the configuration file)."""
    plugins: dict[str, dict[str, Any] | None] | None = None
    """Plugin instances: section name -> its settings. None = the profile's defaults."""

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        return None if v is None else names.validate_prefix(v)

    @field_validator("brokers")
    @classmethod
    def _brokers(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one broker host:port is needed")
        for b in v:
            parse_broker(b)
        return v

    @property
    def node_prefix(self) -> str:
        return self.prefix or names.validate("/" + short_hostname())

    def broker_list(self) -> list[tuple[str, int]]:
        return [parse_broker(b) for b in self.brokers]


def parse_broker(text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``host``, a bare IPv6 address (port 1883 when none)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"broker {text!r}: expected [IPv6 address]:port")
        port = rest[1:] if rest else "1883"
    elif text.count(":") > 1:
        host, port = text, "1883"  # a bare IPv6 address: every colon is the address's
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"broker {text!r}: not an IPv6 address; write [address]:port for a port"
            ) from None
    else:
        host, sep, port = text.partition(":")
        if not sep:
            port = "1883"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"broker {text!r}: expected host:port with a port in 1..65535")
    return host or "127.0.0.1", int(port)
