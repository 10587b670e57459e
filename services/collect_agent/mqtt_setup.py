"""Builds the built-in MQTT endpoint from the collect agent's settings (one call from the app)."""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Callable, Mapping

from services.collect_agent.ingest import Ingestor
from services.collect_agent.metrics import AgentMetrics
from services.collect_agent.mqtt_auth import MqttAuth
from services.collect_agent.mqtt_limits import EndpointLimits
from services.collect_agent.mqtt_rebalance import Peers, Rebalancer
from services.collect_agent.mqtt_server import MqttServer
from services.collect_agent.mqtt_sessions import SessionStore
from services.collect_agent.settings import Settings
from services.common.errors import ConfigError

log = logging.getLogger(__name__)


def tls_context(s: Settings) -> ssl.SSLContext | None:
    if s.mqtt_tls_cert is None:
        return None
    if s.mqtt_tls_key is None:
        raise ConfigError("collect_agent.mqtt_tls_cert is set but mqtt_tls_key is not")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(s.mqtt_tls_cert, s.mqtt_tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"collect_agent.mqtt_tls_cert/key: cannot load: {exc}") from exc
    return ctx


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def build_endpoint(
    s: Settings,
    ingestor: Ingestor,
    metrics: AgentMetrics,
    tokens: Callable[[], Mapping[str, str]] | None = None,
) -> MqttServer:
    """The endpoint, not started. ``tokens``: Kelvin's credentials, {token: role}."""
    anonymous = s.mqtt_anonymous
    if anonymous is None:
        anonymous = not (s.mqtt_users or s.mqtt_node_secret or (tokens is not None and tokens()))
    host = s.mqtt_host or s.host
    if anonymous and not _loopback(host):
        log.warning(
            "MQTT endpoint on %s accepts publishers without credentials (every topic): "
            "configure credentials (auth tokens, mqtt_users, mqtt_node_secret)",
            host,
        )
    auth = MqttAuth(s.mqtt_users, s.mqtt_node_secret, s.mqtt_acl, tokens, anonymous)
    limits = EndpointLimits(
        connect_timeout_s=s.connect_timeout_s,
        max_connections=s.max_connections,
        max_packet_bytes=s.max_payload_bytes,
        connect_max_bytes=s.mqtt_connect_max_bytes,
        partial_budget_bytes=s.mqtt_partial_budget_bytes,
        stall_timeout_s=s.mqtt_stall_timeout_s,
    )
    sessions = SessionStore(metrics, s.mqtt_max_sessions, max_expiry_s=s.mqtt_session_expiry_max_s)
    server = MqttServer(
        ingestor,
        metrics,
        host,
        s.mqtt_port,
        limits,
        ssl_context=tls_context(s),
        auth=auth,
        sessions=sessions,
    )
    peers = (
        Peers(s.mqtt_peers, s.mqtt_peers_dns, s.port) if s.mqtt_peers or s.mqtt_peers_dns else None
    )
    if peers is not None or s.mqtt_max_connection_age_s is not None:
        server.rebalancer = Rebalancer(
            server,
            peers,
            s.mqtt_rebalance_interval_s,
            s.mqtt_rebalance_per_s,
            s.mqtt_rebalance_tolerance,
            s.mqtt_max_connection_age_s,
        )
    return server
