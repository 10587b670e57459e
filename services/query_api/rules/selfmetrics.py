"""Kelvin's own service metrics as PromQL series, so alert rules can watch ingest and storage.

The rule manager scrapes the collect agent's ``/metrics`` (``collect_agent_url``)
and reads the query API's own registry at every evaluation, like a Prometheus
scraping them: each sample keeps its labels plus ``job`` and ``instance``, and
``up{job, instance}`` is 1 or 0. Samples are kept in memory for
``retention_s`` (bounded by ``max_series``), enough for ``rate(...[5m])``; the
default hall rules (ingest stalled, spool filling, storage unreachable) read
them. Sensor data stays in storage; :class:`CombinedSource` lets one query use both.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.common.logs import RateLimitedLog
from services.common.promnames import Labels
from services.query_api.promql.regex import Matcher
from services.query_api.promql.source import RawSeries, Source, matches

log = logging.getLogger(__name__)
_scrape_log = RateLimitedLog(log, 60.0)


class MemorySeries:
    """Scraped samples of every series, oldest dropped after ``retention_ns``."""

    def __init__(self, retention_ns: int, max_series: int = 20_000) -> None:
        self.retention_ns = retention_ns
        self.max_series = max_series
        self.series: dict[Labels, deque[tuple[int, float]]] = {}

    def add(self, labels: Labels, t_ns: int, value: float) -> None:
        q = self.series.get(labels)
        if q is None:
            if len(self.series) >= self.max_series:
                return
            q = self.series[labels] = deque()
        if q and q[-1][0] >= t_ns:
            return
        q.append((t_ns, value))
        while q and q[0][0] < t_ns - self.retention_ns:
            q.popleft()

    def select(self, matchers: Sequence[Matcher], start_ns: int, end_ns: int) -> list[RawSeries]:
        out = []
        for labels, q in self.series.items():
            if not matches(labels, matchers):
                continue
            pts = [(t, v) for t, v in q if start_ns <= t <= end_ns]
            if pts:
                ts = np.fromiter((t for t, _ in pts), dtype=np.int64, count=len(pts))
                vs = np.fromiter((v for _, v in pts), dtype=np.float64, count=len(pts))
                out.append(RawSeries(labels, ts, vs))
        return sorted(out, key=lambda s: s.labels)


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def _registry_text(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode("utf-8")


class Scraper:
    """Scrapes the configured targets into a :class:`MemorySeries` when asked."""

    def __init__(
        self, store: MemorySeries, collect_agent_url: str | None, own: CollectorRegistry | None
    ) -> None:
        self.store = store
        self.targets: list[tuple[str, str, str]] = []
        if collect_agent_url:
            instance = urlsplit(collect_agent_url).netloc or collect_agent_url
            self.targets.append(
                ("kelvin-collect-agent", instance, collect_agent_url.rstrip("/") + "/metrics")
            )
        self.own = own
        self._client = httpx.AsyncClient(timeout=5.0)

    def _put(
        self, job: str, instance: str, t_ns: int, samples: list[tuple[str, dict[str, str], float]]
    ) -> None:
        for name, labels, value in samples:
            full = {**labels, "__name__": name, "job": job, "instance": instance}
            self.store.add(tuple(sorted(full.items())), t_ns, value)

    async def scrape(self, t_ns: int) -> None:
        for job, instance, url in self.targets:
            up = 0.0
            try:
                r = await self._client.get(url)
                r.raise_for_status()
                self._put(job, instance, t_ns, _samples(r.text))
                up = 1.0
            except (httpx.HTTPError, ValueError) as exc:
                _scrape_log.warning(url, "scrape of %s failed: %s", url, exc)
            self.store.add((("__name__", "up"), ("instance", instance), ("job", job)), t_ns, up)
        if self.own is not None:
            self._put("kelvin-query-api", "self", t_ns, _samples(_registry_text(self.own)))
            self.store.add(
                (("__name__", "up"), ("instance", "self"), ("job", "kelvin-query-api")), t_ns, 1.0
            )

    async def aclose(self) -> None:
        await self._client.aclose()


class CombinedSource:
    """Sensors and scraped service metrics, as one source of series."""

    def __init__(self, sensors: Source, memory: MemorySeries) -> None:
        self.sensors = sensors
        self.memory = memory

    async def select(
        self, matchers: Sequence[Matcher], start_ns: int, end_ns: int
    ) -> list[RawSeries]:
        found = await self.sensors.select(matchers, start_ns, end_ns)
        found.extend(self.memory.select(matchers, start_ns, end_ns))
        return sorted(found, key=lambda s: s.labels)

    async def names(self, matchers: Sequence[Matcher]) -> list[Labels]:
        own = [s.labels for s in self.memory.select(matchers, -(2**62), 2**62)]
        return sorted([*await self.sensors.names(matchers), *own])
