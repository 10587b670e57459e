"""Prometheus metrics: one registry per service, names per Prometheus conventions.

Every metric is named ``kelvin_<service>_<thing>_<unit>[_total]``. Each service
owns a :class:`ServiceMetrics` so that ``kelvin up`` (all services in one
process) still serves each service's own ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]


class ServiceMetrics:
    """A registry plus factories that prefix names with ``kelvin_<service>_``."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.service = service
        self.prefix = f"kelvin_{service}_"
        self.registry = registry or CollectorRegistry(auto_describe=True)
        if registry is None:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        self.up = self.gauge("up", "1 while the service is serving")
        self.info = self.gauge("build_info", "Build information", ["version"])

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """``name`` without prefix; counters get ``_total`` from the client library."""
        return Counter(
            self.prefix + name.removesuffix("_total"), doc, labels, registry=self.registry
        )

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self.prefix + name, doc, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] | None = None,
    ) -> Histogram:
        if buckets:
            return Histogram(
                self.prefix + name, doc, labels, registry=self.registry, buckets=tuple(buckets)
            )
        return Histogram(self.prefix + name, doc, labels, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
