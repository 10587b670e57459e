"""The pusher's Prometheus metrics (``kelvin_pusher_*``), in its own light registry."""

from __future__ import annotations

from services.pusher.prom import Registry


class PusherMetrics:
    """Counters and gauges of sampling and publishing, in one registry."""

    def __init__(self, metrics: Registry | None = None) -> None:
        m = metrics or Registry("pusher")
        self.service = m
        self.reads = m.counter("reads_total", "Successful group reads", ["plugin"])
        self.readings = m.counter("readings_total", "Readings queued for publishing", ["plugin"])
        self.invalid = m.counter(
            "invalid_readings_total", "Raw readings that were NaN or infinite", ["plugin"]
        )
        self.read_errors = m.counter(
            "read_errors_total", "Group reads that failed", ["plugin", "reason"]
        )
        self.skipped = m.counter(
            "skipped_beats_total", "Sampling instants skipped because a read overran", ["plugin"]
        )
        self.dropped = m.counter(
            "readings_dropped_total", "Readings dropped before reaching a broker", ["reason"]
        )
        self.sent = m.counter("readings_sent_total", "Readings a broker accepted")
        self.messages = m.counter("messages_sent_total", "PUBLISH messages accepted", ["kind"])
        self.buffered = m.gauge(
            "buffer_readings", "Readings waiting for the broker (the outage buffer)"
        )
        self.connected = m.gauge("broker_connected", "1 while connected to a broker")
        self.connects = m.counter("broker_connects_total", "Successful connects", ["broker"])
        self.connect_errors = m.counter(
            "broker_errors_total", "Failed connects and lost connections", ["broker"]
        )
        self.server_disconnects = m.counter(
            "broker_disconnects_total",
            "DISCONNECTs the broker sent (MQTT 5), by reason code (0x8B, 0x9C, 0x9D: reconnected)",
            ["reason"],
        )
        self.http_refused = m.counter(
            "http_refused_total",
            "REST requests refused before any handler ran (auth, host, origin, limits)",
            ["reason"],
        )
        self.plugin_errors = m.counter(
            "plugin_errors_total",
            "Problems a plugin absorbed (e.g. allocator unreachable: last placement kept)",
            ["plugin", "reason"],
        )
        self.plugins = m.gauge("plugins_running", "Plugin instances sampling")
        self.sensors = m.gauge("sensors", "Sensors of loaded plugins")
