"""Prometheus metrics of the storage backends (``kelvin_storage_*``).

A backend lives inside a service (collect agent, query API, a CLI command),
so it registers its metrics in that service's registry when given one. Every
backend in one registry shares one :class:`StorageMetrics` (labels tell them
apart), so several backends in one process never register a name twice.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry

from services.common.metrics import ServiceMetrics

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class StorageMetrics:
    """Counters and histograms shared by every backend of one registry."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, StorageMetrics] = (
        weakref.WeakKeyDictionary()
    )
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry) -> None:
        m = ServiceMetrics("storage", registry)
        self.service = m
        self.written = m.counter(
            "written_readings_total", "Readings stored by write()", ["backend"]
        )
        self.read_points = m.counter(
            "read_points_total", "Points returned by range reads", ["backend"]
        )
        self.op_seconds = m.histogram(
            "operation_seconds",
            "Time per storage operation",
            ["backend", "op"],
            buckets=_LATENCY_BUCKETS,
        )
        self.errors = m.counter(
            "errors_total", "Failed storage operations by cause", ["backend", "reason"]
        )
        self.retries = m.counter(
            "retries_total", "Attempts repeated after a retryable failure", ["backend"]
        )
        self.compactions = m.counter(
            "compactions_total", "Compactions of staged writes into chunks (SQLite)", ["backend"]
        )
        self.staged = m.gauge(
            "staged_readings", "Readings written but not yet compacted (SQLite)", ["backend"]
        )

    @classmethod
    def of(cls, registry: CollectorRegistry | None) -> StorageMetrics:
        """The metrics of ``registry`` (a private registry when None)."""
        if registry is None:
            return cls(CollectorRegistry(auto_describe=True))
        with cls._lock:
            found = cls._by_registry.get(registry)
            if found is None:
                found = cls._by_registry[registry] = cls(registry)
            return found
