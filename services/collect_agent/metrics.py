"""Prometheus metrics of the collect agent and the ingest statistics the REST API shows."""

from __future__ import annotations

import time
from collections import deque

from services.common.metrics import ServiceMetrics

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class AgentMetrics:
    """Every metric of the agent, created once per service instance (own registry)."""

    def __init__(self) -> None:
        m = self.service = ServiceMetrics("collect_agent")
        self.messages = m.counter(
            "messages_received_total", "Messages (PUBLISHes, HTTP lines) received", ["transport"]
        )
        self.readings_spooled = m.counter(
            "readings_spooled_total", "Readings made durable in the spool (and acknowledged)"
        )
        self.readings_written = m.counter("readings_written_total", "Readings written to storage")
        self.rejected = m.counter(
            "rejected_total", "Messages or lines rejected as bad input, by reason", ["reason"]
        )
        self.commits = m.counter("spool_commits_total", "Group commits to the spool")
        self.commit_seconds = m.histogram(
            "spool_commit_seconds",
            "Time from the first publish of a group to its durable commit (added ack latency)",
            buckets=_LATENCY_BUCKETS,
        )
        self.spool_errors = m.counter(
            "spool_errors_total", "Group commits the disk refused (nothing acknowledged)"
        )
        self.spool_bytes = m.gauge("spool_bytes", "Bytes of spool segment files on disk")
        self.spool_readings = m.gauge("spool_pending_readings", "Readings spooled, not yet stored")
        self.spool_records = m.gauge("spool_pending_records", "Spool records not yet stored")
        self.spool_limit = m.gauge("spool_limit_bytes", "Spool disk quota")
        self.replayed = m.counter(
            "spool_replayed_readings_total", "Readings replayed from the spool after a restart"
        )
        self.damaged_bytes = m.counter(
            "spool_damaged_bytes_total",
            "Spool bytes that were no intact record, skipped and kept in <spool>/damaged; "
            "kind=incomplete: a write cut short (never acknowledged), damaged: anything else",
            ["kind"],
        )
        self.damaged_records = m.counter(
            "spool_damaged_records_total",
            "Spool records skipped as damaged (as far as their headers are readable)",
            ["kind"],
        )
        self.damaged_readings = m.counter(
            "spool_damaged_readings_total",
            "Readings in skipped spool records (as far as their headers are readable)",
            ["kind"],
        )
        self.orphan_readings = m.counter(
            "spool_orphan_readings_total",
            "Readings written to storage from spools this agent claimed (their agent gone)",
        )
        self.storage_seconds = m.histogram(
            "storage_write_seconds", "Duration of one storage write", buckets=_LATENCY_BUCKETS
        )
        self.storage_errors = m.counter(
            "storage_errors_total", "Failed storage writes (retried), by kind", ["kind"]
        )
        self.quarantined = m.counter(
            "quarantined_readings_total",
            "Readings storage refused permanently, kept in the spool's quarantine file",
        )
        self.backpressure = m.gauge(
            "backpressure", "1 while the agent stops reading publishes (spool full or behind)"
        )
        self.backpressure_events = m.counter(
            "backpressure_events_total", "Times back-pressure started"
        )
        self.connections = m.gauge("mqtt_connections_open", "Open MQTT connections")
        self.connections_total = m.counter("mqtt_connections_total", "Accepted MQTT connections")
        self.disconnects = m.counter(
            "mqtt_disconnects_total", "Closed MQTT connections, by reason", ["reason"]
        )
        # -------------------------------------------------------------- MQTT endpoint bounds
        self.partial_bytes = m.gauge(
            "mqtt_partial_bytes", "Bytes held for partially received MQTT packets, all connections"
        )
        self.partial_limit = m.gauge(
            "mqtt_partial_limit_bytes", "Budget for partially received MQTT packets"
        )
        self.partial_waits = m.counter(
            "mqtt_partial_waits_total",
            "Connections paused because the partial-packet budget was full",
        )
        self.accept_errors = m.counter(
            "mqtt_accept_errors_total", "Failed accepts of MQTT connections, by errno", ["errno"]
        )
        self.sessions = m.gauge("mqtt_sessions", "MQTT sessions held (connected and detached)")
        self.sessions_ended = m.counter(
            "mqtt_sessions_ended_total", "Detached MQTT sessions dropped, by reason", ["reason"]
        )
        self.metadata = m.counter("metadata_updates_total", "Sensor metadata records received")
        self.jobs = m.counter("jobs_total", "Job records received")
        self.cache_sensors = m.gauge("cache_sensors", "Sensors in the sensor cache")
        self.broker_connected = m.gauge(
            "broker_connected", "1 while subscribed to the external broker"
        )


class Rates:
    """Readings/s over a sliding window, from counters sampled once a second."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int, int]] = deque()

    def sample(self, spooled: int, written: int) -> None:
        now = time.monotonic()
        self._samples.append((now, spooled, written))
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def rates(self) -> tuple[float, float]:
        """(received readings/s, written readings/s)."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        t0, s0, w0 = self._samples[0]
        t1, s1, w1 = self._samples[-1]
        dt = max(t1 - t0, 1e-9)
        return (s1 - s0) / dt, (w1 - w0) / dt
